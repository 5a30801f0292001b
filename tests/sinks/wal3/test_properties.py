"""Properties (Hypothesis): manifest apply, snapshot roll-up and GC keep setsums balanced."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sinks.wal3 import (
    Fragment,
    Manifest,
    Setsum,
    Snapshot,
    SnapshotOptions,
    SnapshotPointer,
    compute_garbage,
    fragment_path,
)

sizes = st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=60)


def make_fragments(record_counts: list[int], first_seq: int = 1,
                   first_offset: int = 1) -> list[Fragment]:
    frags = []
    offset = first_offset
    for i, n in enumerate(record_counts):
        seq = first_seq + i
        frags.append(Fragment(fragment_path(seq), seq, offset, offset + n, 100 + n,
                              Setsum.of([b"%d" % seq])))
        offset += n
    return frags


def leaves(manifest: Manifest, snapshots: dict[SnapshotPointer, Snapshot]) -> list[Fragment]:
    out: list[Fragment] = []

    def walk(ptrs: tuple[SnapshotPointer, ...], frags: tuple[Fragment, ...]) -> None:
        for ptr in ptrs:
            snap = snapshots[ptr]
            snap.scrub()
            assert snap.to_pointer() == ptr
            walk(snap.snapshots, snap.fragments)
        out.extend(frags)

    walk(manifest.snapshots, manifest.fragments)
    return out


def build(record_counts: list[int], frag_threshold: int, snap_threshold: int,
          ) -> tuple[Manifest, dict[SnapshotPointer, Snapshot], list[Fragment]]:
    """Append fragments one by one, rolling up snapshots as a writer would."""
    options = SnapshotOptions(frag_threshold, snap_threshold)
    manifest = Manifest.new_empty("prop")
    snapshots: dict[SnapshotPointer, Snapshot] = {}
    frags = make_fragments(record_counts)
    for frag in frags:
        manifest = manifest.apply_fragments([frag], "prop")
        snap = manifest.generate_snapshot(options, "prop")
        if snap is not None:
            snapshots[snap.to_pointer()] = snap
            manifest = manifest.apply_snapshot(snap)
    return manifest, snapshots, frags


@settings(max_examples=60, deadline=None)
@given(sizes)
def test_apply_fragments_balances(record_counts: list[int]) -> None:
    """Appending fragments keeps setsum == sum(fragments); offsets and seq_no follow on;
    the JSON round-trips."""
    frags = make_fragments(record_counts)
    manifest = Manifest.new_empty("prop")
    for frag in frags:
        assert manifest.can_apply(frag)
        manifest = manifest.apply_fragments([frag], "prop")
    manifest.scrub()
    total = Setsum()
    for frag in frags:
        total = total + frag.setsum
    assert manifest.setsum == total
    assert manifest.next_offset == 1 + sum(record_counts)
    assert manifest.next_seq_no == len(frags) + 1
    assert Manifest.from_json(manifest.to_json()) == manifest


@settings(max_examples=60, deadline=None)
@given(sizes, st.integers(min_value=1, max_value=6), st.integers(min_value=2, max_value=4))
def test_snapshot_rollup_conserves_everything(record_counts: list[int], frag_threshold: int,
                                              snap_threshold: int) -> None:
    """Rolling pointers into snapshots never changes the setsum, the leaves or their
    order; every snapshot scrubs and matches its pointer."""
    manifest, snapshots, frags = build(record_counts, frag_threshold, snap_threshold)
    manifest.scrub()
    assert leaves(manifest, snapshots) == frags
    assert len(manifest.fragments) <= frag_threshold + 1
    total = Setsum()
    for frag in frags:
        total = total + frag.setsum
    assert manifest.setsum == total and manifest.collected == Setsum()


@settings(max_examples=80, deadline=None)
@given(sizes, st.integers(min_value=1, max_value=6), st.integers(min_value=2, max_value=4),
       st.lists(st.floats(min_value=0, max_value=1.2), min_size=1, max_size=3))
def test_gc_moves_setsum_into_collected(record_counts: list[int], frag_threshold: int,
                                        snap_threshold: int, cuts: list[float]) -> None:
    """Collections at rising cutoffs: the manifest's setsum never changes, collected grows
    by exactly what was dropped, only fragments wholly below the cutoff go, and what is
    left is every later fragment, in order."""
    manifest, snapshots, frags = build(record_counts, frag_threshold, snap_threshold)
    end = manifest.next_offset
    collected = Setsum()
    for fraction in sorted(cuts):
        cutoff = max(1, int(fraction * end))
        garbage = compute_garbage(manifest, cutoff, snapshots.__getitem__)
        if garbage is None:
            assert all(f.limit > cutoff or f.limit <= manifest.oldest_offset
                       for f in leaves(manifest, snapshots))
            continue
        for snap in garbage.snapshots_to_make:
            snapshots[snap.to_pointer()] = snap
        dropped = [f for f in frags if garbage.fragments_to_drop_start <= f.seq_no
                   < garbage.fragments_to_drop_limit]
        assert dropped and all(f.limit <= cutoff for f in dropped)
        discard = Setsum()
        for frag in dropped:
            discard = discard + frag.setsum
        assert discard == garbage.setsum_to_discard
        before = manifest
        manifest = manifest.apply_garbage(garbage)
        manifest.scrub()
        collected = collected + discard
        assert manifest.setsum == before.setsum
        assert manifest.collected == collected
        assert manifest.oldest_offset == garbage.first_to_keep <= cutoff
        kept = leaves(manifest, snapshots)
        assert kept == [f for f in frags if f.seq_no >= garbage.fragments_to_drop_limit]
        assert manifest.next_offset == end and manifest.next_seq_no == len(frags) + 1
        referenced = {p.path_to_snapshot for p in manifest.snapshots}
        assert not referenced & {p.path_to_snapshot for p in garbage.snapshots_to_drop}
        more = make_fragments([3], manifest.next_seq_no, manifest.next_offset)
        grown = manifest.apply_fragments(more, "prop")
        grown.scrub()
        assert grown.next_offset == end + 3
