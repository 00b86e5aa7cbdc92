"""Checkpoints are written atomically; resuming skips an unreadable newest checkpoint."""

from __future__ import annotations

import torch
from trainer_fakes import checkpointer


def test_save_is_atomic_and_leaves_no_temporary_files(tmp_path):
    model, _, ckpt = checkpointer(tmp_path)
    ckpt.save("model_0000009", iteration=9)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last_checkpoint", "model_0000009.pth"]
    assert (tmp_path / "last_checkpoint").read_text() == "model_0000009.pth"
    data = torch.load(tmp_path / "model_0000009.pth", weights_only=True)
    assert data["iteration"] == 9
    torch.testing.assert_close(data["model"]["weight"], model.weight.detach())


def test_resume_skips_a_truncated_newest_checkpoint_for_the_previous_one(
    tmp_path, caplog, captured_warnings
):
    model, holder, ckpt = checkpointer(tmp_path)
    with torch.no_grad():
        model.weight.fill_(1.0)
    holder.iteration = 9
    ckpt.save("model_0000009", iteration=9)
    with torch.no_grad():
        model.weight.fill_(2.0)
    holder.iteration = 19
    ckpt.save("model_0000019", iteration=19)
    newest = tmp_path / "model_0000019.pth"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # truncated copy

    fresh_model, fresh_holder, fresh = checkpointer(tmp_path)
    with captured_warnings("megdet.trainer.checkpoint"):
        state = fresh.resume_latest()
    assert state["iteration"] == 9
    assert fresh_holder.iteration == 9
    assert torch.all(fresh_model.weight == 1.0)
    assert any("model_0000019.pth" in r.getMessage() for r in caplog.records)


def test_resume_prefers_the_last_saved_checkpoint_then_the_highest_number_and_none_without_any(
    tmp_path,
):
    _, _, empty = checkpointer(tmp_path / "empty")
    assert empty.resume_latest() is None
    _, holder, ckpt = checkpointer(tmp_path)
    for it in (4, 14, 9):
        holder.iteration = it
        ckpt.save(f"model_{it:07d}", iteration=it)
    # The last saved, as last_checkpoint names it: after a resize to a larger batch, a run's
    # newest checkpoint can have a lower number than an earlier world's.
    _, fresh_holder, fresh = checkpointer(tmp_path)
    assert fresh.resume_latest()["iteration"] == 9
    assert fresh_holder.iteration == 9
    (tmp_path / "last_checkpoint").unlink()
    _, fresh_holder, fresh = checkpointer(tmp_path)
    assert fresh.resume_latest()["iteration"] == 14
    assert fresh_holder.iteration == 14
