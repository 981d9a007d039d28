"""A destroyed group is released at once, its Gloo threads gone, even when the job builds its
optimizer (torch.optim's first import of torch._dynamo) after the group formed: a group left alive
keeps its threads and connections, and is destroyed only during the interpreter's finalization,
where a Gloo thread can abort the process (exit -6; group.py imports torch._dynamo first)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from dpeer.launch.cluster import free_port_block

_CHILD = textwrap.dedent("""
    import os, sys
    import torch
    import torch.distributed as dist
    from dpeer.address import Address
    from dpeer.trainer.group import GroupManager
    from dpeer.view import View

    def gloo_threads():
        names = (open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
        return sorted(n for n in names if "gloo" in n)

    manager = GroupManager("a", backend="gloo", init_timeout=30.0)
    manager.form(View(1, ("a",), Address("127.0.0.1", int(sys.argv[1]))))
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)  # torch._dynamo's first import
    model(torch.ones(2, 4)).sum().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad, async_op=True).wait()
    optimizer.step()
    during = gloo_threads()
    manager.close()
    print("during", ",".join(during))
    print("after", ",".join(gloo_threads()))
""")


def test_a_destroyed_group_leaves_no_gloo_thread_after_the_optimizer_is_built() -> None:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(free_port_block(2))], capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(line.split(" ", 1) if " " in line else (line, "") for line in out.stdout.splitlines())
    assert lines["during"], "the group ran Gloo threads (the check below would otherwise prove nothing)"
    assert lines["after"] == "", f"Gloo threads still running after the group was destroyed: {lines['after']}"
