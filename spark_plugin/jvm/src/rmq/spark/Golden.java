package rmq.spark;

import java.util.Base64;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarMap;

/**
 * The decoder's output for one pull body as JSON rows (bodies in Base64, timestamps in
 * microseconds), through the very vectors a read fills: what the tests compare, column by column,
 * with rmq_core's native decode_columns over the same bytes.  A body that does not decode gives
 * {"error": reason, "offset": n}.
 */
public final class Golden {
    /** columns: names of the source's columns but topic and broker_name (constants of a read), comma-separated. */
    public static String decode(byte[] body, long untilOffset, String columns) throws Exception {
        String[] names = columns.split(",");
        int[] cols = new int[names.length];
        for (int k = 0; k < cols.length; k++) {
            names[k] = names[k].trim();
            cols[k] = Columns.index(names[k]);
        }
        ObjectMapper json = new ObjectMapper();
        Records.Sink sink = new Records.Sink(cols, body.length / Records.RECORD_FIXED_V4 + 1, null);
        ColumnVector[] v = new ColumnVector[cols.length];
        for (int k = 0; k < cols.length; k++) v[k] = sink.column(k);
        try {
            Records.decode(body, body.length, untilOffset, sink);
        } catch (Records.DecodeException e) {
            ObjectNode err = json.createObjectNode();
            err.put("error", e.reason);
            err.put("offset", e.offset);
            return json.writeValueAsString(err);
        }
        ArrayNode rows = json.createArrayNode();
        for (int r = 0; r < sink.rows; r++) {
            ObjectNode row = rows.addObject();
            for (int k = 0; k < cols.length; k++) {
                switch (cols[k]) {
                    case Columns.QUEUE_ID: case Columns.RECONSUME_TIMES: row.put(names[k], v[k].getInt(r)); break;
                    case Columns.QUEUE_OFFSET: case Columns.BORN_TIMESTAMP: case Columns.STORE_TIMESTAMP:
                        row.put(names[k], v[k].getLong(r)); break;
                    case Columns.MSG_ID: case Columns.TAGS: case Columns.KEYS:
                        row.put(names[k], v[k].isNullAt(r) ? null : v[k].getUTF8String(r).toString()); break;
                    case Columns.BODY: row.put(names[k], Base64.getEncoder().encodeToString(v[k].getBinary(r))); break;
                    case Columns.PROPERTIES: {
                        ArrayNode props = row.putArray(names[k]);
                        ColumnarMap m = v[k].getMap(r);
                        for (int i = 0; i < m.numElements(); i++) {
                            props.addArray().add(m.keyArray().getUTF8String(i).toString()).add(m.valueArray().getUTF8String(i).toString());
                        }
                        break;
                    }
                    default: throw new IllegalArgumentException("not a decoded column: " + names[k]);
                }
            }
        }
        sink.close();
        return json.writeValueAsString(rows);
    }

    private Golden() { }
}
