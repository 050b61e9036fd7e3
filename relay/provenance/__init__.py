"""Provenance: what makes ktm's copies exact.

Every destination batch ktm writes says which source records it holds, in a record header
`ktm.src` on its last record: `<cluster>/<topic>/<partition>/<a>-<b>[,<c>-<d>...]`, the runs of
source offsets the batch copies, the i-th record the i-th offset (the batch form; older
versions wrote `.../<offset>` on every record, the record form, still read). Nothing about a
copy is assumed from offsets: a destination offset N need not hold source offset N (filters,
fan-in, fixed partitions, other writers, a log not starting at 0), so every question of where
a copy stands is answered by reading the header back.

- **Resume**: a source partition resumes after the highest source offset the destination's
  tail names, or at the relay group's committed offset where that is later.
- **Translation**: a consumer group's committed source offset becomes the destination offset of
  the first copy of that offset or a later one (restore --groups, the relay's group sync).
- **Verify**: a destination record is matched to its source record by the offset its header
  names, so a copy is compared record by record (relay.pipelines.verify).

A source topic deleted and created again, and followed into the same destination, starts its
offsets over: its copies name it `topic~n`, the n-th **incarnation**, and the relay group's
commits carry `ktm.incarnation=n`, so copies of two incarnations are never confused. A
compacted destination's log cleaner may remove the record carrying a batch's header; such a
batch has lost its provenance, and is told apart by its records where it must be.

Modules (this package's face imports none of them, so the executor side loads only the ones it
uses):
- `header`: the header's format and parsing, the record form's prefix, incarnations and the
  commit marks; pure text (relay.batches.records encodes it as a record header).
- `copies`: what one destination batch holds, the rule for either form, and whether it lost its
  provenance.
- `resume`: where each source partition resumes, from the destination's tails and the
  committed offsets; the continuity check of a failover.
- `translation`: source offsets to destination offsets, by a binary search over copies.
- `attribution`: batches of a compacted destination that lost their provenance, told apart by
  comparing their records with the source's.
"""
