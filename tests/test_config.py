"""Config validation: every bad value is one line naming the flag and the fix."""
import pytest

from distkit.config import Config
from distkit.errors import DistkitError


def test_defaults_are_valid():
    cfg = Config().validate()
    assert cfg.dataset == "digits" and cfg.backend == "auto"


@pytest.mark.parametrize("changes, words", [
    ({"backend": "mpi2"}, ["--backend", "'mpi2'", "gloo"]),
    ({"dataset": "imagenet"}, ["--dataset", "digits"]),
    ({"model": "vit"}, ["--model", "cnn"]),
    ({"epochs": 0}, ["--epochs", "> 0"]),
    ({"batch_size": -1}, ["--batch-size"]),
    ({"lr": 0.0}, ["--lr"]),
    ({"num_workers": -2}, ["--num-workers", ">= 0"]),
    ({"nnodes": 2, "node_rank": 0}, ["--master-addr"]),
    ({"nnodes": 2, "master_addr": "127.0.0.1"}, ["--node-rank", "0 on the first node"]),
    ({"nnodes": 2, "node_rank": 2, "master_addr": "127.0.0.1"}, ["--node-rank 2", "0 to 1"]),
    ({"node_rank": -1}, ["--node-rank -1"]),
    ({"master_port": 70000}, ["--master-port 70000"]),
    ({"nproc_per_node": 4, "batch_size": 2}, ["--batch-size 2", "world size 4", ">= 4"]),
])
def test_bad_values_fail_with_one_actionable_line(changes, words):
    with pytest.raises(DistkitError) as info:
        Config(**changes).validate()
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message


def test_batch_check_counts_all_nodes():
    cfg = Config(nproc_per_node=2, nnodes=2, node_rank=0, master_addr="127.0.0.1", batch_size=3)
    with pytest.raises(DistkitError, match="world size 4"):
        cfg.validate()


def test_replace_returns_a_copy():
    cfg = Config()
    other = cfg.replace(epochs=3)
    assert cfg.epochs == 10 and other.epochs == 3
