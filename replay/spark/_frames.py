"""Small helpers shared by the Spark modules: column conversions and driver tables."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Final

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

__all__ = ["absent", "CELL", "as_unsigned", "spark_schema", "table_frame"]

CELL: Final = ("table", "row", "column")
def absent() -> Column:
    """The tagged bytes of ABSENT (``b""``, sinks.codec) as a binary literal."""
    return F.lit(bytearray()).cast("binary")
_TWO_64: Final = 1 << 64


def spark_schema(schema: pa.Schema) -> StructType:
    return from_arrow_schema(schema)


def as_unsigned(column: Column) -> Column:
    """An int64 bit view of a uint64 as decimal(20,0): the unsigned value, ordered right
    across 2**63 (ids pass it in 2038)."""
    signed = column.cast("decimal(20,0)")
    return F.when(column < 0, signed + F.lit(Decimal(_TWO_64))).otherwise(
        signed).cast("decimal(20,0)")


def table_frame(spark: SparkSession, schema: pa.Schema, columns: Mapping[str, Sequence[object]]
                ) -> DataFrame:
    """A small driver-built table as a DataFrame (through Arrow, exact types)."""
    table = pa.table({f.name: pa.array(columns[f.name], f.type) for f in schema}, schema=schema)
    return spark.createDataFrame(table)
