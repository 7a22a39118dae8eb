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
    ({"epochs": 0}, ["--epochs", ">= 1"]),
    ({"batch_size": -1}, ["--batch-size"]),
    ({"lr": 0.0}, ["--lr"]),
    ({"num_workers": -2}, ["--num-workers", ">= 0"]),
    ({"nnodes": 2, "node_rank": 0}, ["--master-addr"]),
    ({"nnodes": 2, "master_addr": "127.0.0.1"}, ["--node-rank", "0 on the first node"]),
    ({"nnodes": 2, "node_rank": 2, "master_addr": "127.0.0.1"}, ["--node-rank 2", "0 to 1"]),
    ({"node_rank": -1}, ["--node-rank", "got -1"]),
    ({"master_port": 70000}, ["--master-port", "got 70000", "1 to 65535"]),
    ({"nproc_per_node": 4, "batch_size": 2}, ["--batch-size 2", "world size 4", ">= 4"]),
    ({"nproc_per_node": 2, "batch_size": 3}, ["--batch-size 3", "world size 2", "2 or 4"]),
    ({"nproc_per_node": 4, "batch_size": 30}, ["does not divide", "28 or 32"]),
    ({"seed": -1}, ["--seed", "from 0 to 4294967295", "got -1"]),
    ({"seed": 2**32}, ["--seed", "got 4294967296"]),
    ({"epochs": 2.5}, ["--epochs", "whole number", "got 2.5"]),
    ({"epochs": True}, ["--epochs", "whole number"]),
    ({"timeout_s": 0}, ["--timeout ", "> 0", "the default 120"]),
    ({"timeout_s": 1e20}, ["--timeout ", "<= 86400"]),
    ({"momentum": 1.0}, ["Config.momentum must", "< 1"]),  # no CLI flag: the field
    ({"warmup_epochs": 3, "epochs": 2}, ["--warmup-epochs 3", "--epochs 2", "2 or less"]),
])
def test_bad_values_fail_with_one_actionable_line(changes, words):
    with pytest.raises(DistkitError) as info:
        Config(**changes).validate()
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message


REAL_FIELDS = ["lr", "timeout_s", "warmup_epochs", "momentum", "weight_decay",
               "early_stopping_min_delta"]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("field", REAL_FIELDS)
def test_nan_and_infinity_are_refused_for_every_real_field(field, value):
    # nan <= 0 is False: a plain range test lets NaN through, and --lr nan trained a
    # garbage model with exit 0
    with pytest.raises(DistkitError) as info:
        Config(**{field: value}).validate()
    flag = {"timeout_s": "--timeout", "momentum": "Config.momentum",
            "weight_decay": "Config.weight_decay"}.get(field, "--" + field.replace("_", "-"))
    message = str(info.value)
    assert message.startswith(f"{flag} must be a finite number"), message
    assert "--timeout-s" not in message  # no such flag
    assert "\n" not in message


def test_every_numeric_field_is_checked():
    """A new numeric field must be added to the range tables, or this fails."""
    from distkit import config as config_module

    checked = {row[0] for row in config_module._WHOLE_NUMBERS + config_module._REAL_NUMBERS}
    numeric = {f.name for f in Config.__dataclass_fields__.values()
               if isinstance(f.default, (int, float)) and not isinstance(f.default, bool)}
    numeric |= config_module._OPTIONAL
    assert numeric == checked


def test_batch_check_counts_all_nodes():
    cfg = Config(nproc_per_node=2, nnodes=2, node_rank=0, master_addr="127.0.0.1", batch_size=3)
    with pytest.raises(DistkitError, match="world size 4"):
        cfg.validate()


def test_replace_returns_a_copy():
    cfg = Config()
    other = cfg.replace(epochs=3)
    assert cfg.epochs == 10 and other.epochs == 3
