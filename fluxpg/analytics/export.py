"""`fluxpg analytics export`: archive a range of a queue's log (before retention drops it) as
Parquet, JSON lines or CSV.

Payloads are kept losslessly:

- no ``--decode``: ``payload`` is the raw bytes — a binary column in Parquet, base64 text in JSON
  and CSV (neither can carry bytes);
- ``--decode utf8``: ``payload_text`` holds the text of every payload that is valid UTF-8; for the
  others ``payload_text`` is null and ``payload`` keeps the bytes (as above); otherwise ``payload``
  is null;
- ``--decode json``: as utf8, plus ``body``, the payload parsed as JSON with the schema of
  ``--json-schema FILE`` or one inferred from a sample of the range (null when a payload does not
  parse). CSV has no structs: its top-level fields become ``body_<field>`` columns, nested values
  JSON text.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fluxpg.analytics.jdbc import (AnalyticsError, JdbcTarget, Position, SeqRange, bounded_ranges, load_queues,
                                   read_log)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

FORMATS = ("parquet", "json", "csv")
DECODES = ("utf8", "json")
SAMPLE_ROWS = 1000
BASE_COLUMNS = ("queue", "partition", "seq", "topic", "routing_key", "headers", "created_at", "expires_at")
TIMESTAMP_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX"


# ---------------------------------------------------------------------------------------------
# Schemas
# ---------------------------------------------------------------------------------------------

_JSON_SCHEMA_TYPES = {"string": "string", "integer": "long", "number": "double", "boolean": "boolean"}


def _from_json_schema(node: dict[str, Any], where: str = "$") -> Any:
    """A JSON Schema (the common subset: object/array/string/integer/number/boolean, nullable
    unions) as a Spark data type."""
    from pyspark.sql.types import (ArrayType, BooleanType, DoubleType, LongType, StringType, StructField,
                                   StructType, TimestampType)

    types = node.get("type", "object" if "properties" in node else "string")
    if isinstance(types, list):
        non_null = [t for t in types if t != "null"]
        types = non_null[0] if len(non_null) == 1 else "string"  # a union stays JSON text
    if types == "object":
        props = node.get("properties")
        if not props:
            return StringType()  # free-form object: keep as JSON text
        return StructType([StructField(k, _from_json_schema(v, f"{where}.{k}"), True) for k, v in props.items()])
    if types == "array":
        return ArrayType(_from_json_schema(node.get("items", {}), f"{where}[]"), True)
    if types == "string" and node.get("format") == "date-time":
        return TimestampType()
    simple = {"string": StringType(), "integer": LongType(), "number": DoubleType(), "boolean": BooleanType()}
    if types not in simple:
        raise AnalyticsError(f"--json-schema: unsupported type {types!r} at {where}")
    return simple[types]


def load_schema(spark: "SparkSession", path: Path) -> "StructType":
    """Read ``--json-schema FILE``: a JSON Schema (``{"type": "object", "properties": …}``), Spark's
    JSON schema (``StructType.json()``), or a Spark DDL string (``id BIGINT, name STRING``)."""
    from pyspark.sql.types import StructType, _parse_datatype_json_string

    try:
        text = path.read_text()
    except OSError as exc:
        raise AnalyticsError(f"--json-schema: cannot read {path}: {exc.strerror}") from None
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    try:
        if isinstance(doc, dict) and doc.get("type") == "struct":
            schema = _parse_datatype_json_string(text)
        elif isinstance(doc, dict):
            schema = _from_json_schema(doc)
        else:
            schema = StructType.fromDDL(text.strip())
    except AnalyticsError:
        raise
    except Exception as exc:
        raise AnalyticsError(f"--json-schema {path}: not a JSON Schema, Spark schema JSON or DDL ({str(exc).splitlines()[0]})") from None
    if not isinstance(schema, StructType):
        raise AnalyticsError(f"--json-schema {path}: the top level must be an object")
    return schema


def infer_schema(spark: "SparkSession", conn, ranges: list[SeqRange], sample: int = SAMPLE_ROWS) -> "StructType | None":
    """The JSON schema of the payloads, inferred by Spark from up to ``sample`` payloads spread over
    the ranges (first rows of each range). None when no sampled payload is a JSON object."""
    texts: list[str] = []
    per_range = max(1, sample // max(1, len(ranges)))
    for r in ranges:
        rows = conn.execute(
            """SELECT payload FROM fluxpg.log WHERE queue_id = %s AND partition = %s AND seq >= %s AND seq < %s
               ORDER BY seq LIMIT %s""", (r.queue_id, r.partition, r.lo, r.hi, per_range)).fetchall()
        for (payload,) in rows:
            try:
                texts.append(bytes(payload).decode("utf-8"))
            except UnicodeDecodeError:
                continue
    objects = [t for t in texts if t.lstrip().startswith("{")]
    if not objects:
        return None
    df = spark.read.option("mode", "DROPMALFORMED").json(spark.sparkContext.parallelize(objects, 1))
    fields = [f for f in df.schema.fields if f.name != "_corrupt_record"]
    if not fields:
        return None
    from pyspark.sql.types import StructType

    return StructType(fields)


# ---------------------------------------------------------------------------------------------
# Shaping
# ---------------------------------------------------------------------------------------------

def shape(df: "DataFrame", fmt: str, decode: str | None = None, schema: "StructType | None" = None) -> "DataFrame":
    """The archive's columns: BASE_COLUMNS plus the payload as the module docstring describes."""
    from pyspark.sql import functions as F

    raw: Column = F.col("payload")
    binary_ok = fmt == "parquet"
    # RFC 4648 base64 on one line: Spark 4's base64() breaks lines every 76 characters (MIME),
    # which strict decoders refuse.
    b64 = F.regexp_replace(F.base64(raw), "[\\r\\n]", "")
    cols = [F.col(c) for c in BASE_COLUMNS]
    if decode is None:
        cols.append((raw if binary_ok else b64).alias("payload"))
        return df.select(*cols)
    text = raw.cast("string")  # reinterprets the bytes, no replacement characters
    valid = F.is_valid_utf8(text)
    kept = F.when(~valid, raw if binary_ok else b64)
    cols += [kept.alias("payload"), F.when(valid, text).alias("payload_text")]
    out = df.select(*cols)
    if decode == "json":
        if schema is None:
            raise AnalyticsError("--decode json: no payload in the range is a JSON object; "
                                 "use --decode utf8, or give --json-schema")
        out = out.withColumn("body", F.from_json("payload_text", schema, {"mode": "PERMISSIVE"}))
        if fmt == "csv":
            from pyspark.sql.types import ArrayType, MapType, StructType

            flat = []
            for f in schema.fields:
                c = F.col("body").getField(f.name)
                if isinstance(f.dataType, (StructType, ArrayType, MapType)):
                    c = F.to_json(c)
                flat.append(c.alias(f"body_{f.name}"))
            out = out.select(*[c for c in out.columns if c != "body"], *flat)
    return out


@dataclass
class ExportResult:
    path: Path
    rows: int
    ranges: list[SeqRange]
    expected: int | None  # offsets in the ranges when both bounds are offsets
    schema: "StructType | None"


def export(spark: "SparkSession", target: JdbcTarget, conn, queue: str, out: Path, *,
           start: Position | None = None, end: Position | None = None, fmt: str = "parquet",
           decode: str | None = None, json_schema: Path | None = None, partitions: list[int] | None = None,
           overwrite: bool = False, num_partitions: int | None = None) -> ExportResult:
    from pyspark.sql import functions as F

    if fmt not in FORMATS:
        raise AnalyticsError(f"invalid --format {fmt!r}: expected one of {', '.join(FORMATS)}")
    if decode is not None and decode not in DECODES:
        raise AnalyticsError(f"invalid --decode {decode!r}: expected utf8 or json")
    if json_schema is not None and decode is None:
        decode = "json"
    if json_schema is not None and decode != "json":
        raise AnalyticsError("--json-schema needs --decode json")
    if out.exists() and not overwrite:
        raise AnalyticsError(f"{out} exists: remove it or pass --overwrite")
    info = load_queues(conn, [queue])[queue]
    ranges, t_from, t_to = bounded_ranges(conn, info, start, end, partitions)
    schema = None
    if decode == "json":
        schema = load_schema(spark, json_schema) if json_schema is not None else infer_schema(spark, conn, ranges)

    df = read_log(spark, target, ranges, num_partitions=num_partitions)
    if t_from is not None:
        df = df.where(F.col("created_at") >= F.lit(t_from))
    if t_to is not None:
        df = df.where(F.col("created_at") < F.lit(t_to))
    shaped = shape(df, fmt, decode, schema).sortWithinPartitions("partition", "seq")
    writer = shaped.write.mode("overwrite" if overwrite else "errorifexists")
    if fmt == "parquet":
        writer.parquet(str(out))
    elif fmt == "json":
        writer.option("timestampFormat", TIMESTAMP_FORMAT).option("ignoreNullFields", False).json(str(out))
    else:
        writer.option("header", True).option("timestampFormat", TIMESTAMP_FORMAT).option("escape", '"').csv(str(out))
    reader = spark.read.format(fmt)
    if fmt == "csv":
        reader = reader.option("header", True)
    try:
        rows = reader.load(str(out)).count()
    except Exception:  # an empty JSON/CSV output has no files Spark can infer a schema from
        rows = 0
    offsets_only = (start is None or start.offset is not None) and (end is None or end.offset is not None)
    expected = sum(r.rows for r in ranges) if offsets_only else None
    return ExportResult(out, rows, ranges, expected, schema)
