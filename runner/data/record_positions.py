"""Where a record stream of TFRecord files stands at a given position, found from the files' record counts alone.

`TFRecordFiles` reads an epoch's files in rounds of up to `files_at_once`
consecutive files (in the epoch's file order); within a round, each file
gives a turn of up to `records_per_turn` records in slot order, until all
of the round's files are used up (a used-up file drops out of the turns).
That stream is a function of the record counts, so the place of any
position in it is found by arithmetic, without reading a record: the round,
the turn and the file a position falls in (`locate`).
"""

from collections.abc import Sequence
import dataclasses


@dataclasses.dataclass(frozen=True)
class RoundPosition:
  """A position inside one round of files.

  Attributes:
    round_index: which round of the epoch (rounds of `files_at_once` files).
    turn: the turn the position falls in (turn t reads records
      `[t * records_per_turn, (t + 1) * records_per_turn)` of each file).
    slot: the file of the round (its index in the round) whose turn it is.
    offset_in_turn: records of that turn already given.
  """

  round_index: int
  turn: int
  slot: int
  offset_in_turn: int


def _given_by_turns(counts: Sequence[int], turns: int, records_per_turn: int) -> int:
  """Records the files of `counts` give in their first `turns` turns."""
  return sum(min(count, turns * records_per_turn) for count in counts)


def locate(counts: Sequence[int], position: int, *, files_at_once: int, records_per_turn: int) -> RoundPosition:
  """Returns where record `position` (from 0) of one epoch's stream is, for files of `counts` records in epoch order.

  Costs a binary search over the turns of one round: nothing is read.

  Raises:
    ValueError: `position` is not below the epoch's record count.
  """
  if not 0 <= position < sum(counts):
    raise ValueError(f"position {position} is outside an epoch of {sum(counts)} records")
  for round_index in range(0, len(counts), files_at_once):
    round_counts = counts[round_index : round_index + files_at_once]
    if position >= sum(round_counts):
      position -= sum(round_counts)
      continue
    low, high = 0, max(round_counts) // records_per_turn + 1  # The turn t with given(t) <= position < given(t + 1).
    while high - low > 1:
      middle = (low + high) // 2
      if _given_by_turns(round_counts, middle, records_per_turn) <= position:
        low = middle
      else:
        high = middle
    position -= _given_by_turns(round_counts, low, records_per_turn)
    for slot, count in enumerate(round_counts):
      in_turn = max(0, min(records_per_turn, count - low * records_per_turn))
      if position < in_turn:
        return RoundPosition(round_index // files_at_once, low, slot, position)
      position -= in_turn
  raise AssertionError("unreachable: the position is inside the epoch")
