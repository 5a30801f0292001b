"""Small results back to Python, and the wide per-table view.

``to_state`` collects a snapshot into the Assembler's shape, decoding the tagged bytes
on the driver (for results that fit in memory). ``wide`` turns the cells of one source
table into one row per row key with one typed column per column, decoding in the
executors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DataType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from sequencer import RowKey, Value
from sinks.codec import decode_key, decode_value

__all__ = ["TAGGED", "to_state", "wide"]

Cell = tuple[str, RowKey, str]
# sinks.codec tags -> the Spark type a column of only that tag (and None) becomes.
_TYPES: Final[dict[int, tuple[DataType, pa.DataType]]] = {
    0x01: (BooleanType(), pa.bool_()),
    0x02: (LongType(), pa.int64()),
    0x03: (DoubleType(), pa.float64()),
    0x04: (StringType(), pa.string()),
    0x05: (BinaryType(), pa.binary()),
}
_NONE_TAG: Final = 0x00
TAGGED: Final = "cdc-agent.tagged"


def to_state(df: DataFrame) -> dict[Cell, Value]:
    """Collect a snapshot (columns ``table``, ``row``, ``column``, ``value``) as
    ``{(table, row, column): value}``, bit for bit the shape of Assembler snapshots."""
    state: dict[Cell, Value] = {}
    for table, row, column, value in df.select("table", "row", "column", "value").collect():
        decoded = decode_value(bytes(value))
        state[(table, decode_key(bytes(row)), column)] = decoded  # type: ignore[assignment]
    return state


def _column_type(tags: set[int]) -> tuple[DataType, pa.DataType] | None:
    """The one type of a column's values (None mixes with any); None: keep tagged bytes."""
    tags = tags - {_NONE_TAG}
    if len(tags) == 1:
        return _TYPES[tags.pop()]
    if not tags:
        return _TYPES[0x04]  # only None: a column of nulls
    return None


def wide(snapshot: DataFrame, table: str) -> DataFrame:
    """One row per row key of ``table``, one typed column per column.

    A column whose values have one type (None aside) gets that type (boolean, bigint,
    double, string, binary; NaN payloads and -0.0 are kept). A column mixing types keeps
    the tagged bytes (``sinks.codec.decode_value`` reads them; the field's metadata
    has ``"cdc-agent.tagged": true``). A missing cell and a
    ``None`` value are both null here; the long form (``snapshot``) tells them apart.
    The row key column ``_row`` is bigint or string (tagged bytes if the table mixes).
    """
    cells = snapshot.filter(F.col("table") == table)
    tag = F.conv(F.hex(F.substring("value", 1, 1)), 16, 10).cast("int")
    row_tag = F.conv(F.hex(F.substring("row", 1, 1)), 16, 10).cast("int")
    found = cells.groupBy("column").agg(F.collect_set(tag).alias("tags")).collect()
    columns = sorted(str(r["column"]) for r in found)
    types = {str(r["column"]): _column_type(set(r["tags"])) for r in found}
    row_tags = {int(r[0]) for r in cells.select(row_tag).distinct().collect()}
    row_type = _TYPES[row_tags.pop()] if len(row_tags) == 1 else None
    pivoted = (cells.withColumnRenamed("row", "__row").groupBy("__row")
               .pivot("column", list[Any](columns)).agg(F.first("value")))
    fields = [_field("_row", row_type)] + [_field(c, types[c]) for c in columns]
    arrow_types = [None if row_type is None else row_type[1]]
    arrow_types += [None if types[c] is None else types[c][1] for c in columns]  # type: ignore[index]
    return pivoted.select("__row", *columns).mapInArrow(
        _decoder(arrow_types, key_first=True), StructType(fields))


def _field(name: str, kind: tuple[DataType, pa.DataType] | None) -> StructField:
    """A typed column, or tagged bytes marked ``{"cdc-agent.tagged": true}`` in its
    metadata (decode them with ``sinks.codec.decode_value``)."""
    if kind is None:
        return StructField(name, BinaryType(), metadata={TAGGED: True})
    return StructField(name, kind[0])


def _decoder(types: list[pa.DataType | None], *, key_first: bool
             ) -> Callable[[Iterable[pa.RecordBatch]], Iterable[pa.RecordBatch]]:
    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            arrays = []
            for i, kind in enumerate(types):
                raw = batch.column(i).to_pylist()
                if kind is None:
                    arrays.append(pa.array(raw, pa.binary()))
                    continue
                decode: Callable[[bytes], Any] = (
                    decode_key if i == 0 and key_first else decode_value)
                arrays.append(pa.array(
                    [None if v is None else decode(v) for v in raw], kind))
            names = [f"c{i}" for i in range(len(types))]
            yield pa.RecordBatch.from_arrays(arrays, names=names)

    return run
