"""Sample-table rows from evaluations and training batches: prompt text, response, version, failures."""

from __future__ import annotations

from areal_core.api.trajectory import Trajectory
from areal_core.sample_tables import eval_rows, train_rows


def _traj(prompt_id: str, versions: list[int], reward: float = 1.0) -> Trajectory:
    n = len(versions)
    return Trajectory(uid=f"{prompt_id}-0", prompt_id=prompt_id, input_ids=list(range(n)), loss_mask=[0, *[1] * (n - 1)],
                      logprobs=[0.0] * n, versions=versions, reward=reward, info={"completion": "4."})  # fmt: skip


def test_eval_rows_take_the_first_items_and_show_a_failure_as_its_error():
    chat = [{"role": "user", "content": "3+3="}]
    items = [{"id": 1, "prompt": "2+2="}, {"id": 2, "prompt": chat}, {"id": 3, "prompt": "x"}]
    rows = eval_rows(6, items, [_traj("1", [-1, 6, 6]), TimeoutError("server gone"), _traj("3", [-1, 6])], k=2)
    assert [row.as_dict() for row in rows] == [
        {"step": 6, "split": "eval", "id": "1", "prompt": "2+2=", "response": "4.", "reward": 1.0, "output_tokens": 2,
         "version": 6},
        {"step": 6, "split": "eval", "id": "2", "prompt": '[{"role": "user", "content": "3+3="}]',
         "response": "TimeoutError: server gone", "reward": 0.0, "output_tokens": 0, "version": 6},
    ]  # fmt: skip


def test_train_rows_carry_the_newest_weight_version_of_each_sample():
    batch = [_traj("a", [-1, -1, 3, 4, 4], 0.0), _traj("b", [-1, 2, 2]), _traj("c", [-1, 4])]
    rows = train_rows(5, batch, {"a": {"id": "a", "prompt": "1+1="}}, k=2)
    assert [(row.id, row.prompt, row.version, row.output_tokens, row.reward) for row in rows] == [
        ("a", "1+1=", 4, 4, 0.0), ("b", "", 2, 2, 1.0),
    ]  # fmt: skip
