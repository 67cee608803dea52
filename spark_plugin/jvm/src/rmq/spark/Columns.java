package rmq.spark;

import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/** The columns of the fixed schema by index, and a narrowed schema (option `columns`, or a user schema). */
final class Columns {
    static final int TOPIC = 0, BROKER_NAME = 1, QUEUE_ID = 2, QUEUE_OFFSET = 3, MSG_ID = 4, TAGS = 5, KEYS = 6,
        BODY = 7, PROPERTIES = 8, BORN_TIMESTAMP = 9, STORE_TIMESTAMP = 10, RECONSUME_TIMES = 11;

    static int index(String name) {
        return RmqTableProvider.SCHEMA.getFieldIndex(name).isDefined()
            ? (Integer) RmqTableProvider.SCHEMA.getFieldIndex(name).get() : -1;
    }

    /** option columns = "body, queue_offset": those columns of the fixed schema, in that order. */
    static StructType schemaOf(String columns) {
        StructType out = new StructType();
        for (String c : columns.split(",")) {
            String name = c.trim();
            int i = index(name);
            if (i < 0) {
                throw new IllegalArgumentException("bad columns " + Remoting.quote(columns) + ": " + Remoting.quote(name)
                    + " is not a column of the rmq source (columns: " + String.join(", ", RmqTableProvider.SCHEMA.fieldNames()) + ")");
            }
            out = out.add(RmqTableProvider.SCHEMA.fields()[i]);
        }
        return out;
    }

    /** A user-given schema must be columns of the fixed schema with their types. */
    static int[] indexesOf(StructType schema) {
        int[] out = new int[schema.fields().length];
        for (int k = 0; k < out.length; k++) {
            StructField f = schema.fields()[k];
            int i = index(f.name());
            if (i < 0 || !RmqTableProvider.SCHEMA.fields()[i].dataType().sameType(f.dataType())) {
                throw new IllegalArgumentException("bad schema: column " + Remoting.quote(f.name() + " " + f.dataType().simpleString())
                    + " is not a column of the rmq source (" + RmqTableProvider.SCHEMA.toDDL() + ")");
            }
            out[k] = i;
        }
        return out;
    }

    private Columns() { }
}
