"""docs/jobs.md followed literally: its module, copied out of the page into a folder outside the
repository and found through PYTHONPATH, with its YAML's options, trains on a two-box cluster
to the end, and each box holds the same model in DATA_DIR/worker/final.pt."""

from __future__ import annotations

import re
from pathlib import Path

import torch
import yaml

from tests.integration.conftest import make_cluster  # noqa: F401 - a fixture
from tests.support.daemons import Daemons, run

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "jobs.md"
TIMEOUT = 240.0


def blocks(kind: str) -> list[str]:
    """The guide's fenced code blocks of one kind (python, yaml), in order."""
    return re.findall(rf"```{kind}\n(.*?)```", GUIDE.read_text(), flags=re.S)


def job(doc: dict | None) -> dict:
    return (doc or {}).get("job") or {}


def test_the_guides_module_trains_on_two_boxes_from_outside_the_repository(make_cluster, tmp_path: Path) -> None:
    jobs = tmp_path / "elsewhere" / "jobs"
    jobs.mkdir(parents=True)
    (jobs / "myjob.py").write_text(next(b for b in blocks("python") if "def build(" in b))
    config = yaml.safe_load(next(b for b in blocks("yaml") if "myjob:build" in b))
    assert config["job"] == "myjob:build"
    del config["job"]  # the cluster passes it as --job
    config["training"].update(steps=60, checkpoint_every=0)  # short, on a shared machine
    cluster: Daemons = make_cluster(2, job="myjob:build", config=config, env={"PYTHONPATH": str(jobs)})
    cluster.start_all()

    def finished(docs: dict) -> bool:
        gone = [n.node_id for n in cluster.nodes if not n.running]
        assert not gone, f"{gone} exited: {cluster.tail(cluster.node(gone[0]), 5)}"
        return all(job(docs.get(n)).get("state") == "finished" for n in ("n1", "n2"))

    ended = run(cluster.wait_for(finished, TIMEOUT, "the guide's job finished on both boxes"))
    assert job(ended["n1"])["step"] == 60 and job(ended["n1"])["digest"] == job(ended["n2"])["digest"]
    models = {n: torch.load(cluster.node(n).data_dir / "worker" / "final.pt", weights_only=True) for n in ("n1", "n2")}
    assert set(models["n1"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert models["n1"]["0.weight"].shape == (32, config["training"]["options"]["dim"])
    assert all(torch.equal(models["n1"][k], models["n2"][k]) for k in models["n1"]), "the boxes' models differ"
