"""The local engine's AdamW (engines/local/adamw.py): torch.optim.AdamW's arithmetic bit for bit,
its state_dict layout both ways, and a training process that never loads torch's compiler stack."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from machine_nb.engines.local.adamw import AdamW

#: (lr, beta1, beta2, eps, weight_decay) per step: Tinker sends the settings with every step
SETTINGS = [(1e-2, 0.9, 0.999, 1e-8, 0.0), (5e-3, 0.9, 0.95, 1e-6, 0.01), (2e-2, 0.8, 0.99, 1e-8, 0.1),
            (1e-3, 0.9, 0.999, 1e-8, 0.0), (7e-3, 0.85, 0.98, 1e-7, 0.05)]


def tensors(seed: int = 0, device: str = "cpu") -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*shape, generator=g).to(device)) for shape in ((5, 7), (11,), (3, 3))]


def backward(params: list[torch.nn.Parameter], step: int) -> None:
    """A loss whose gradients differ per step; the last tensor gets none on odd steps."""
    used = params if step % 2 == 0 else params[:-1]
    loss = sum(((p - 0.1 * step) ** 2 * (i + 1)).sum() + torch.sin(p * step).sum() for i, p in enumerate(used))
    loss.backward()


def torch_step(opt: torch.optim.AdamW, lr: float, b1: float, b2: float, eps: float, wd: float) -> None:
    for group in opt.param_groups:
        group.update(lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    opt.step()
    opt.zero_grad(set_to_none=True)


CUDA = pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                    reason="needs a CUDA GPU; the CPU case runs the same steps"))


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_every_step_matches_torchs_adamw_bit_for_bit(device):
    ours_p, theirs_p = tensors(device=device), tensors(device=device)
    ours, theirs = AdamW(ours_p), torch.optim.AdamW(theirs_p, foreach=False)
    for i, (lr, b1, b2, eps, wd) in enumerate(SETTINGS):
        backward(ours_p, i)
        backward(theirs_p, i)
        ours.step(lr=lr, beta1=b1, beta2=b2, eps=eps, weight_decay=wd)
        ours.zero_grad()
        torch_step(theirs, lr, b1, b2, eps, wd)
        assert all(torch.equal(a, b) for a, b in zip(ours_p, theirs_p)), f"step {i}"
        assert all(p.grad is None for p in ours_p)
    for p, q in zip(ours_p, theirs_p):
        assert {k: v.tolist() for k, v in ours.state[p].items()} == {k: v.tolist() for k, v in theirs.state[q].items()}
        # torch's layout on any device: the step count on the CPU, the moments beside the tensor
        assert ({k: v.device.type for k, v in ours.state[p].items()}
                == {k: v.device.type for k, v in theirs.state[q].items()}
                == {"step": "cpu", "exp_avg": device, "exp_avg_sq": device})
    assert float(ours.state[ours_p[-1]]["step"]) == 3 and float(ours.state[ours_p[0]]["step"]) == 5


@pytest.mark.parametrize("saved_by", ["ours", "torch"])
def test_a_saved_state_loads_in_either_and_the_run_goes_on_identically(saved_by, tmp_path):
    first, second = tensors(1), tensors(1)
    opt = AdamW(first) if saved_by == "ours" else torch.optim.AdamW(first, foreach=False)
    for i, s in enumerate(SETTINGS[:3]):
        backward(first, i)
        if saved_by == "ours":
            opt.step(lr=s[0], beta1=s[1], beta2=s[2], eps=s[3], weight_decay=s[4])
            opt.zero_grad()
        else:
            torch_step(opt, *s)
    torch.save(opt.state_dict(), tmp_path / "optimizer.pt")
    with torch.no_grad():
        for p, q in zip(second, first):
            p.copy_(q)
    mine, torchs = AdamW(second), torch.optim.AdamW(tensors(1), foreach=False)
    with torch.no_grad():
        for p, q in zip(torchs.param_groups[0]["params"], first):
            p.copy_(q)
    mine.load_state_dict(torch.load(tmp_path / "optimizer.pt", weights_only=True))
    torchs.load_state_dict(torch.load(tmp_path / "optimizer.pt", weights_only=True))
    for i, s in enumerate(SETTINGS[3:], start=3):
        backward(second, i)
        backward(torchs.param_groups[0]["params"], i)
        mine.step(lr=s[0], beta1=s[1], beta2=s[2], eps=s[3], weight_decay=s[4])
        mine.zero_grad()
        torch_step(torchs, *s)
    assert all(torch.equal(a, b) for a, b in zip(second, torchs.param_groups[0]["params"]))


def test_a_state_for_other_tensors_is_refused():
    opt = AdamW(tensors())
    backward(opt.params, 0)
    opt.step(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8)
    with pytest.raises(ValueError, match="the state is for 3 tensors, this run trains 2"):
        AdamW(tensors()[:2]).load_state_dict(opt.state_dict())
    other = [torch.nn.Parameter(torch.zeros(2, 2)), *tensors()[1:]]
    with pytest.raises(ValueError, match=r"exp_avg of tensor 0 has shape \(5, 7\), the tensor \(2, 2\)"):
        AdamW(other).load_state_dict(opt.state_dict())


def test_training_steps_of_the_local_engine_load_no_compiler():
    # torch's own optimizers import torch._dynamo on first use: seconds in every training process
    script = textwrap.dedent("""
        import sys
        import numpy as np
        from machine_nb.engines.local.compute import Example, Trainer
        trainer = Trainer("local/arith-tiny", 4)
        batch = [Example(ids=[1, 2, 3, 4], targets=np.array([2, 3, 4, 5]), weights=np.ones(4, dtype=np.float32))]
        for _ in range(2):
            trainer.guarded_forward_backward(batch, backward=True)
            trainer.guarded_optim_step(learning_rate=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, grad_clip_norm=1.0)
        print(sorted(m for m in sys.modules if m.startswith("torch._dynamo")))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
