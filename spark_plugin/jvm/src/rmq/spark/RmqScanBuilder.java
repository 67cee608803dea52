package rmq.spark;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.TreeSet;

import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownFilters;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.sources.And;
import org.apache.spark.sql.sources.EqualTo;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.sources.GreaterThan;
import org.apache.spark.sql.sources.GreaterThanOrEqual;
import org.apache.spark.sql.sources.In;
import org.apache.spark.sql.sources.LessThan;
import org.apache.spark.sql.sources.LessThanOrEqual;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * Column pruning and filter pushdown.  Pushed exactly (not evaluated again by Spark): tags = / IN
 * (the broker's tag filter, the exact tag re-checked on decode), broker_name and queue_id = / IN
 * (queues left out), queue_offset comparisons (each queue's range narrowed).  store_timestamp >= / >
 * starts each queue at the broker's offset for that time and stays a filter Spark evaluates (store
 * times are not strictly ordered within a queue).
 */
final class RmqScanBuilder implements ScanBuilder, SupportsPushDownRequiredColumns, SupportsPushDownFilters {
    final StructType tableSchema;
    final CaseInsensitiveStringMap options;
    final RmqTableProvider.RmqTable table;
    StructType required;
    final Pushed pushed = new Pushed();
    private Filter[] pushedFilters = new Filter[0];

    /** What the pushed filters narrow the read to. */
    static final class Pushed implements java.io.Serializable {
        TreeSet<String> tags;         // null: no tag filter pushed
        TreeSet<String> brokers;      // null: every broker
        TreeSet<Integer> queueIds;    // null: every queue
        long minOffset = 0, maxOffsetExclusive = Long.MAX_VALUE;
        long storeTimeFrom = -1;      // ms; -1 none

        boolean empty() {
            return (tags != null && tags.isEmpty()) || (brokers != null && brokers.isEmpty())
                || (queueIds != null && queueIds.isEmpty()) || minOffset >= maxOffsetExclusive;
        }

        @Override
        public String toString() {
            List<String> parts = new ArrayList<>();
            if (tags != null) parts.add("tags=" + tags);
            if (brokers != null) parts.add("brokers=" + brokers);
            if (queueIds != null) parts.add("queueIds=" + queueIds);
            if (minOffset > 0 || maxOffsetExclusive < Long.MAX_VALUE) parts.add("offsets=[" + minOffset + ", " + maxOffsetExclusive + ")");
            if (storeTimeFrom >= 0) parts.add("storeTimeFrom=" + storeTimeFrom);
            return String.join(", ", parts);
        }
    }

    RmqScanBuilder(StructType tableSchema, CaseInsensitiveStringMap options, RmqTableProvider.RmqTable table) {
        this.tableSchema = tableSchema;
        this.options = options;
        this.table = table;
        this.required = tableSchema;
    }

    @Override
    public void pruneColumns(StructType requiredSchema) { required = requiredSchema; }

    @Override
    public Filter[] pushFilters(Filter[] filters) {
        ReadOptions o = new ReadOptions(options.asCaseSensitiveMap(), false);
        List<Filter> residual = new ArrayList<>();
        List<Filter> done = new ArrayList<>();
        for (Filter f : filters) {
            int r = push(f, o);
            if (r != 0) done.add(f);
            if (r != 1) residual.add(f);
        }
        pushedFilters = done.toArray(new Filter[0]);
        return residual.toArray(new Filter[0]);
    }

    /** 1: applied exactly; 2: narrows the read, Spark still evaluates it; 0: not pushed. */
    private int push(Filter f, ReadOptions o) {
        if (f instanceof And) {
            And a = (And) f;
            // both sides must be pushable exactly for the conjunction to be dropped
            int l = push(a.left(), o), r = push(a.right(), o);
            return l == 1 && r == 1 ? 1 : (l != 0 || r != 0 ? 2 : 0);
        }
        String attr = attribute(f);
        if (attr == null) return 0;
        Object[] values = values(f);
        switch (attr) {
            case "tags":
                if (values == null || !o.expressionType.equals("TAG")) return 0;
                TreeSet<String> vs = new TreeSet<>();
                for (Object v : values) {
                    if (!(v instanceof String) || ((String) v).contains("||") || ((String) v).trim().isEmpty()) return 0;
                    vs.add((String) v);
                }
                if (pushed.tags == null) {
                    TreeSet<String> own = Pull.splitTags(o.expression);
                    pushed.tags = own.isEmpty() ? null : own;
                }
                if (pushed.tags == null) pushed.tags = vs; else pushed.tags.retainAll(vs);
                return 1;
            case "broker_name": {
                if (values == null) return 0;
                TreeSet<String> b = new TreeSet<>();
                for (Object v : values) if (v instanceof String) b.add((String) v); else return 0;
                if (pushed.brokers == null) pushed.brokers = b; else pushed.brokers.retainAll(b);
                return 1;
            }
            case "queue_id": {
                if (values == null) return 0;
                TreeSet<Integer> q = new TreeSet<>();
                for (Object v : values) if (v instanceof Integer) q.add((Integer) v); else return 0;
                if (pushed.queueIds == null) pushed.queueIds = q; else pushed.queueIds.retainAll(q);
                return 1;
            }
            case "queue_offset": {
                long v;
                if (f instanceof EqualTo && ((EqualTo) f).value() instanceof Long) {
                    v = (Long) ((EqualTo) f).value();
                    pushed.minOffset = Math.max(pushed.minOffset, v);
                    pushed.maxOffsetExclusive = Math.min(pushed.maxOffsetExclusive, v + 1);
                } else if (f instanceof GreaterThan && ((GreaterThan) f).value() instanceof Long) {
                    pushed.minOffset = Math.max(pushed.minOffset, (Long) ((GreaterThan) f).value() + 1);
                } else if (f instanceof GreaterThanOrEqual && ((GreaterThanOrEqual) f).value() instanceof Long) {
                    pushed.minOffset = Math.max(pushed.minOffset, (Long) ((GreaterThanOrEqual) f).value());
                } else if (f instanceof LessThan && ((LessThan) f).value() instanceof Long) {
                    pushed.maxOffsetExclusive = Math.min(pushed.maxOffsetExclusive, (Long) ((LessThan) f).value());
                } else if (f instanceof LessThanOrEqual && ((LessThanOrEqual) f).value() instanceof Long) {
                    pushed.maxOffsetExclusive = Math.min(pushed.maxOffsetExclusive, (Long) ((LessThanOrEqual) f).value() + 1);
                } else {
                    return 0;
                }
                pushed.minOffset = Math.max(0, pushed.minOffset);
                return 1;
            }
            case "store_timestamp": {
                Object v = f instanceof GreaterThan ? ((GreaterThan) f).value()
                    : f instanceof GreaterThanOrEqual ? ((GreaterThanOrEqual) f).value() : null;
                if (!(v instanceof java.sql.Timestamp) && !(v instanceof java.time.Instant)) return 0;
                long ms = v instanceof java.sql.Timestamp ? ((java.sql.Timestamp) v).getTime() : ((java.time.Instant) v).toEpochMilli();
                pushed.storeTimeFrom = Math.max(pushed.storeTimeFrom, ms);
                return 2;
            }
            default:
                return 0;
        }
    }

    private static String attribute(Filter f) {
        if (f instanceof EqualTo) return ((EqualTo) f).attribute();
        if (f instanceof In) return ((In) f).attribute();
        if (f instanceof GreaterThan) return ((GreaterThan) f).attribute();
        if (f instanceof GreaterThanOrEqual) return ((GreaterThanOrEqual) f).attribute();
        if (f instanceof LessThan) return ((LessThan) f).attribute();
        if (f instanceof LessThanOrEqual) return ((LessThanOrEqual) f).attribute();
        return null;
    }

    private static Object[] values(Filter f) {
        if (f instanceof EqualTo) return new Object[] {((EqualTo) f).value()};
        if (f instanceof In) return ((In) f).values();
        return null;
    }

    @Override
    public Filter[] pushedFilters() { return Arrays.copyOf(pushedFilters, pushedFilters.length); }

    @Override
    public Scan build() { return new RmqScan(this); }
}
