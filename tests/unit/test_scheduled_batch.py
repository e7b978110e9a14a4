"""ScheduledBatch keeps its token count as requests join and are preempted (the step's budget reads it)."""

from python_layer.inference.scheduler import ScheduledBatch


def test_token_count_follows_the_requests_added_and_dropped() -> None:
    a, b, c = object(), object(), object()
    batch = ScheduledBatch()
    batch.add(a, 5)
    batch.add(b, 1)
    batch.add(c, 7)
    assert batch.num_tokens == 13
    batch.drop(b)
    assert [r for r, _ in batch.items] == [a, c]
    assert batch.num_tokens == 12 == sum(n for _, n in batch.items)
    batch.drop(b)  # not in the batch any more: nothing changes
    batch.drop(a)
    batch.drop(c)
    assert batch.num_tokens == 0 and not batch
