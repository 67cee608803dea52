package rmq.spark;

import java.util.Base64;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.sql.vectorized.ColumnarMap;

/**
 * The decoder's output for one pull body as JSON rows (bodies in Base64, timestamps in
 * microseconds), through the very vectors a read fills: what the tests compare, column by column,
 * with rmq_core's native decode_columns over the same bytes.  A body that does not decode gives
 * {"error": reason, "offset": n}.
 */
public final class Golden {
    public static String decode(byte[] body, long untilOffset) throws Exception {
        int[] cols = {Columns.QUEUE_ID, Columns.QUEUE_OFFSET, Columns.MSG_ID, Columns.TAGS, Columns.KEYS, Columns.BODY,
                      Columns.PROPERTIES, Columns.BORN_TIMESTAMP, Columns.STORE_TIMESTAMP, Columns.RECONSUME_TIMES};
        WritableColumnVector[] v = new WritableColumnVector[cols.length];
        for (int k = 0; k < cols.length; k++) {
            v[k] = new OnHeapColumnVector(body.length / Records.RECORD_FIXED_V4 + 1, RmqTableProvider.SCHEMA.fields()[cols[k]].dataType());
        }
        ObjectMapper json = new ObjectMapper();
        Records.Sink sink = new Records.Sink(cols, v, null);
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
            row.put("queue_id", v[0].getInt(r));
            row.put("queue_offset", v[1].getLong(r));
            row.put("msg_id", v[2].getUTF8String(r).toString());
            row.put("tags", v[3].isNullAt(r) ? null : v[3].getUTF8String(r).toString());
            row.put("keys", v[4].isNullAt(r) ? null : v[4].getUTF8String(r).toString());
            row.put("body", Base64.getEncoder().encodeToString(v[5].getBinary(r)));
            ArrayNode props = row.putArray("properties");
            ColumnarMap m = v[6].getMap(r);
            for (int i = 0; i < m.numElements(); i++) {
                props.addArray().add(m.keyArray().getUTF8String(i).toString()).add(m.valueArray().getUTF8String(i).toString());
            }
            row.put("born_timestamp", v[7].getLong(r));
            row.put("store_timestamp", v[8].getLong(r));
            row.put("reconsume_times", v[9].getInt(r));
        }
        for (WritableColumnVector c : v) c.close();
        return json.writeValueAsString(rows);
    }

    private Golden() { }
}
