package rmq.spark;

import java.util.TreeSet;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/** Columnar reads only: each pull becomes one ColumnarBatch of the selected columns. */
final class RmqReaderFactory implements PartitionReaderFactory {
    private final int[] columns;
    private final TreeSet<String> pushedTags;

    RmqReaderFactory(int[] columns, TreeSet<String> pushedTags) {
        this.columns = columns;
        this.pushedTags = pushedTags;
    }

    @Override
    public boolean supportColumnarReads(InputPartition partition) { return true; }

    @Override
    public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
        return new RmqColumnarReader((RmqInputPartition) partition, columns);
    }

    @Override
    public PartitionReader<InternalRow> createReader(InputPartition partition) {
        throw new UnsupportedOperationException("the rmq source reads columnar batches only");
    }
}
