package rmq.spark;

import java.util.Arrays;

import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarArray;
import org.apache.spark.sql.vectorized.ColumnarMap;
import org.apache.spark.unsafe.types.BinaryView;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * The body column of a batch without copying the bodies: a row is a range of the pull answer it
 * came in (or of its inflated body), valid until the reader makes its next batch, as Spark's own
 * vectors are reused from batch to batch.  getBinary copies the range out, as OnHeapColumnVector's does.
 */
final class BodyVector extends ColumnVector {
    private byte[][] arrays = new byte[0][];
    private int[] offsets = new int[0], lengths = new int[0];

    BodyVector(int capacity) {
        super(DataTypes.BinaryType);
        reserve(capacity);
    }

    void reserve(int capacity) {
        if (capacity > arrays.length) {
            arrays = Arrays.copyOf(arrays, capacity);
            offsets = Arrays.copyOf(offsets, capacity);
            lengths = Arrays.copyOf(lengths, capacity);
        }
    }

    void put(int row, byte[] b, int offset, int length) {
        arrays[row] = b;
        offsets[row] = offset;
        lengths[row] = length;
    }

    @Override
    public byte[] getBinary(int row) { return Arrays.copyOfRange(arrays[row], offsets[row], offsets[row] + lengths[row]); }

    @Override
    public BinaryView getBinaryView(int row) { return BinaryView.fromBytes(arrays[row], offsets[row], lengths[row]); }

    @Override
    public UTF8String getUTF8String(int row) { return UTF8String.fromBytes(arrays[row], offsets[row], lengths[row]); }

    @Override
    public boolean hasNull() { return false; }

    @Override
    public int numNulls() { return 0; }

    @Override
    public boolean isNullAt(int row) { return false; }

    @Override
    public void close() { Arrays.fill(arrays, null); }

    private static UnsupportedOperationException notBinary() {
        return new UnsupportedOperationException("the body column is binary");
    }

    @Override public boolean getBoolean(int row) { throw notBinary(); }
    @Override public byte getByte(int row) { throw notBinary(); }
    @Override public short getShort(int row) { throw notBinary(); }
    @Override public int getInt(int row) { throw notBinary(); }
    @Override public long getLong(int row) { throw notBinary(); }
    @Override public float getFloat(int row) { throw notBinary(); }
    @Override public double getDouble(int row) { throw notBinary(); }
    @Override public ColumnarArray getArray(int row) { throw notBinary(); }
    @Override public ColumnarMap getMap(int row) { throw notBinary(); }
    @Override public Decimal getDecimal(int row, int precision, int scale) { throw notBinary(); }
    @Override public ColumnVector getChild(int ordinal) { throw notBinary(); }
}
