package rmq.spark;

import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.execution.vectorized.ConstantColumnVector;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * One partition as ColumnarBatches, one per pull; the vectors are reused from batch to batch.
 * A read of nothing but topic, broker_name, queue_id and queue_offset (a count, too) without a
 * filter pulls no messages: a queue's offsets are dense, so [from, until) are its rows (as
 * KafkaRDD counts); the broker's min offset is still checked first, so retention is reported alike.
 */
final class RmqColumnarReader implements PartitionReader<ColumnarBatch> {
    private final RmqInputPartition part;
    private final Pull pull;
    private final int[] cols;
    private final ColumnVector[] out;
    private final ConstantColumnVector[] constants;
    private final Records.Sink sink;
    private int capacity = Pull.PULL_BATCH;
    private ColumnarBatch batch;
    private final boolean offsetsOnly;
    private long nextOffset = -1;  // offsetsOnly: the next row's offset
    private static final int POSITIONAL_BATCH = 4096;

    RmqColumnarReader(RmqInputPartition part, int[] cols) {
        this.part = part;
        this.pull = new Pull(part);
        this.cols = cols;
        this.constants = new ConstantColumnVector[cols.length];
        this.sink = new Records.Sink(cols, capacity, part.expressionType.equals("TAG") ? exactTags(part.expression) : null);
        this.out = new ColumnVector[cols.length];
        for (int k = 0; k < cols.length; k++) out[k] = sink.column(k);  // (topic, broker_name: made per batch)
        boolean positional = part.expressionType.equals("TAG") && Pull.splitTags(part.expression).isEmpty();
        for (int c : cols) {
            positional &= c == Columns.TOPIC || c == Columns.BROKER_NAME || c == Columns.QUEUE_ID || c == Columns.QUEUE_OFFSET;
        }
        this.offsetsOnly = positional;
    }

    private boolean nextPositional() {
        if (nextOffset < 0) nextOffset = pull.firstKeptOffset();
        if (nextOffset >= part.untilOffset) return false;
        if (capacity < POSITIONAL_BATCH) {
            capacity = POSITIONAL_BATCH;
            sink.reserve(capacity);
        }
        int rows = (int) Math.min(POSITIONAL_BATCH, part.untilOffset - nextOffset);
        sink.reset();
        for (int k = 0; k < cols.length; k++) {
            WritableColumnVector v = sink.vectors[k];
            if (v == null) continue;
            if (cols[k] == Columns.QUEUE_ID) v.putInts(0, rows, part.queueId);
            else for (int i = 0; i < rows; i++) v.putLong(i, nextOffset + i);
        }
        nextOffset += rows;
        return finish(rows);
    }

    private static java.util.Set<String> exactTags(String expression) {
        java.util.TreeSet<String> t = Pull.splitTags(expression);
        return t.isEmpty() ? null : t;
    }

    @Override
    public boolean next() {
        if (offsetsOnly) return nextPositional();
        while (true) {
            int size = pull.next();
            if (size < 0) return false;
            sink.reset();
            int rows = decode(pull.body, size);
            if (rows == 0) continue;
            return finish(rows);
        }
    }

    private boolean finish(int rows) {
        for (int k = 0; k < cols.length; k++) {
            if (sink.column(k) != null) continue;
            DataType t = RmqTableProvider.SCHEMA.fields()[cols[k]].dataType();
            ConstantColumnVector c = new ConstantColumnVector(rows, t);
            c.setUtf8String(UTF8String.fromString(cols[k] == Columns.TOPIC ? part.topic : part.brokerName));
            if (constants[k] != null) constants[k].close();
            constants[k] = c;
            out[k] = c;
        }
        batch = new ColumnarBatch(out, rows);
        return true;
    }

    private int decode(byte[] body, int size) {
        // a pull holds at most PULL_BATCH records, but a body may still grow past the capacity
        // (a larger pull size on the broker): grow the fixed-width vectors first
        int records = size / Records.RECORD_FIXED_V4 + 1;
        if (records > capacity) {
            capacity = records;
            sink.reserve(capacity);
        }
        return Records.decode(body, size, part.untilOffset, sink);
    }

    @Override
    public ColumnarBatch get() { return batch; }

    @Override
    public void close() {
        pull.close();
        sink.close();
        for (ConstantColumnVector c : constants) if (c != null) c.close();
    }
}
