package rmq.spark;

import java.util.Arrays;
import java.util.EnumSet;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;

import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * format("rmq") in the JVM: batch and streaming reads are columnar and pruned here; writes go to
 * the Python data source, registered by spark_plugin.register(spark) as "rmq_python" (the one
 * implementation of the writer, with the same options).
 */
public final class RmqTableProvider implements TableProvider, DataSourceRegister {
    public static final String PYTHON_SOURCE = "rmq_python";

    /** Every column of the source (the Python source's arrow.SCHEMA_DDL). */
    public static final StructType SCHEMA = new StructType(new StructField[] {
        field("topic", DataTypes.StringType), field("broker_name", DataTypes.StringType),
        field("queue_id", DataTypes.IntegerType), field("queue_offset", DataTypes.LongType),
        field("msg_id", DataTypes.StringType), field("tags", DataTypes.StringType), field("keys", DataTypes.StringType),
        field("body", DataTypes.BinaryType),
        field("properties", DataTypes.createMapType(DataTypes.StringType, DataTypes.StringType, true)),
        field("born_timestamp", DataTypes.TimestampType), field("store_timestamp", DataTypes.TimestampType),
        field("reconsume_times", DataTypes.IntegerType),
    });

    /** The schema of a read without option includeProperties (as Kafka's includeHeaders): no
     * `properties`, the widest column, unless a query asks for it (the Python source's DEFAULT_COLUMNS). */
    public static final StructType DEFAULT_SCHEMA = new StructType(Arrays.stream(SCHEMA.fields())
        .filter(f -> !f.name().equals("properties")).toArray(StructField[]::new));

    private static StructField field(String name, DataType type) {
        return new StructField(name, type, true, org.apache.spark.sql.types.Metadata.empty());
    }

    @Override
    public String shortName() { return "rmq"; }

    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
        boolean include = ReadOptions.flag(options.get("includeProperties"), "includeProperties", false);
        String columns = options.get("columns");
        if (columns != null) return Columns.schemaOf(columns);
        return include ? SCHEMA : DEFAULT_SCHEMA;
    }

    @Override
    public boolean supportsExternalMetadata() { return true; }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
        return new RmqTable(schema == null ? DEFAULT_SCHEMA : schema, partitioning, properties);
    }

    static final class RmqTable implements SupportsRead, SupportsWrite {
        private final StructType schema;
        private final Transform[] partitioning;
        private final Map<String, String> properties;
        private Table python;

        RmqTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
            this.schema = schema;
            this.partitioning = partitioning;
            this.properties = properties;
        }

        /** The Python source's table (writes). */
        Table python() {
            if (python == null) {
                PythonDataSourceV2 p = new PythonDataSourceV2();
                p.setShortName(PYTHON_SOURCE);
                try {
                    python = p.getTable(schema, partitioning, properties);
                } catch (RuntimeException e) {
                    if (String.valueOf(e.getMessage()).contains(PYTHON_SOURCE)) {
                        throw new IllegalStateException("writes of format('rmq') run in the Python "
                            + "data source: call spark_plugin.register(spark) on this session first (" + e.getMessage() + ")", e);
                    }
                    throw e;
                }
            }
            return python;
        }

        @Override
        public String name() { return "rmq"; }

        @Override
        public StructType schema() { return schema; }

        @Override
        public Set<TableCapability> capabilities() {
            return EnumSet.of(TableCapability.BATCH_READ, TableCapability.MICRO_BATCH_READ, TableCapability.BATCH_WRITE,
                              TableCapability.STREAMING_WRITE, TableCapability.TRUNCATE);
        }

        @Override
        public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
            Columns.indexesOf(schema);  // a user schema names columns of the fixed one (a write's need not)
            return new RmqScanBuilder(schema, options, this);
        }

        @Override
        public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
            return ((SupportsWrite) python()).newWriteBuilder(info);
        }
    }

    static Set<String> names(String... n) { return new HashSet<>(Arrays.asList(n)); }
}
