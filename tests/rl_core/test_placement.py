"""GPU placement on hand-made node descriptions (no GPU needed: placement is pure logic)."""

from __future__ import annotations

import pytest

from rl_core.config.run_config import RunConfig
from rl_core.cluster.placement import PlacementError, check_placement, detect_gpus, even_split


def gpu_config(**sections: dict) -> RunConfig:
    data = {
        "inference": {"engine": "vllm", "device": "cuda", "num_servers": 1, "gpus_per_server": 4, "tensor_parallel_size": 4},
        "trainer": {"backend": "deepspeed", "device": "cuda", "gpus": 4, "zero_stage": 3},
    }
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    return RunConfig.model_validate(data)


def test_pipelinerl_default_four_plus_four_on_eight_gpus() -> None:
    placement = check_placement(gpu_config(), 8)
    assert [server.cuda_visible_devices for server in placement.servers] == ["0,1,2,3"]
    assert placement.trainer.cuda_visible_devices == "4,5,6,7"
    assert placement.trainer.env() == {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    assert (placement.tensor_parallel_size, placement.trainer_world_size, placement.zero_stage) == (4, 4, 3)
    assert placement.gpus_used == 8 and placement.unused_gpus == ()
    assert "trainer-rank3: GPUs 7" in placement.summary() and "weight_sync=nccl" in placement.summary()


def test_servers_get_disjoint_sets_from_the_visible_indices() -> None:
    # A node where only GPUs 2,3,5,6,7 are free (e.g. the launcher's own CUDA_VISIBLE_DEVICES).
    config = gpu_config(inference={"num_servers": 2, "gpus_per_server": 2, "tensor_parallel_size": 2}, trainer={"gpus": 1})
    placement = check_placement(config, [2, 3, 5, 6, 7])
    assert [server.gpus for server in placement.servers] == [(2, 3), (5, 6)]
    assert placement.trainer.gpus == (7,)
    every = [gpu for p in [*placement.servers, placement.trainer] for gpu in p.gpus]
    assert len(every) == len(set(every))


def test_too_few_gpus_is_refused_with_the_arithmetic() -> None:
    config = gpu_config(inference={"num_servers": 2})
    with pytest.raises(PlacementError) as error:
        check_placement(config, 8)
    message = str(error.value)
    assert "needs 12 GPUs" in message and "2 server(s) x 4" in message and "has 8" in message


def test_inconsistent_configs_are_refused_naming_the_fields() -> None:
    with pytest.raises(PlacementError, match="gpus_per_server=2 must equal inference.tensor_parallel_size=4"):
        check_placement(gpu_config(inference={"gpus_per_server": 2}), 8)
    with pytest.raises(PlacementError, match="engine 'reference' runs on one GPU"):
        check_placement(gpu_config(inference={"engine": "reference"}), 8)
    with pytest.raises(PlacementError, match="trainer.backend 'torch' trains on one GPU"):
        check_placement(gpu_config(trainer={"backend": "torch", "zero_stage": 0}), 8)
    with pytest.raises(PlacementError, match="zero_stage=3 needs trainer.backend 'deepspeed'"):
        check_placement(gpu_config(trainer={"backend": "torch", "gpus": 1}), 8)
    with pytest.raises(PlacementError, match="trainer.gpus=2 but trainer.device is 'cpu'"):
        check_placement(RunConfig.model_validate({"trainer": {"gpus": 2}}), 8)
    with pytest.raises(PlacementError, match="distinct"):
        check_placement(gpu_config(), [0, 0, 1])


def test_cpu_run_hides_every_gpu() -> None:
    placement = check_placement(RunConfig(), [0, 1])
    assert all(p.cuda_visible_devices == "" and p.device == "cpu" for p in [*placement.servers, placement.trainer])
    assert placement.unused_gpus == (0, 1)
    # ... and needs none.
    assert check_placement(RunConfig(), 0).gpus_used == 0


def test_gpu_defaults_fill_in_zero_counts() -> None:
    # gpus_per_server=0 on cuda means "tensor_parallel_size GPUs"; trainer.gpus=0 means 1.
    config = gpu_config(inference={"gpus_per_server": 0, "tensor_parallel_size": 2}, trainer={"gpus": 0})
    placement = check_placement(config, 3)
    assert placement.servers[0].gpus == (0, 1) and placement.trainer.gpus == (2,)


def test_even_split_feeds_a_valid_placement() -> None:
    split = even_split(8, tensor_parallel_size=2)
    assert split == {"inference.num_servers": 2, "inference.gpus_per_server": 2, "inference.tensor_parallel_size": 2, "trainer.gpus": 4}
    config = gpu_config(inference={"num_servers": 2, "gpus_per_server": 2, "tensor_parallel_size": 2}, trainer={"gpus": 4})
    assert check_placement(config, 8).gpus_used == 8
    assert even_split(2) == {"inference.num_servers": 1, "inference.gpus_per_server": 1, "inference.tensor_parallel_size": 1, "trainer.gpus": 1}
    with pytest.raises(PlacementError):
        even_split(1)


def test_detect_gpus_on_this_machine_is_a_list() -> None:
    # No GPU (or no driver) here: an empty list, never an exception.
    found = detect_gpus()
    assert isinstance(found, list) and all(isinstance(index, int) for index in found)


def test_trainer_ranks_get_one_gpu_each_and_their_rendezvous_env() -> None:
    placement = check_placement(gpu_config(), 8)
    assert [rank.gpus for rank in placement.trainer_ranks] == [(4,), (5,), (6,), (7,)]
    env = placement.rank_env(2, master_port=29555)
    # The rank sees only GPU 6, renumbered cuda:0, so DeepSpeed's device index (LOCAL_RANK) is 0.
    assert env == {"CUDA_VISIBLE_DEVICES": "6", "RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0",
                   "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"}
    assert placement.weight_sync_backend == "nccl"
    with pytest.raises(ValueError, match="rank must be in 0..3"):
        placement.rank_env(4, master_port=29555)


def test_cpu_ranks_for_a_deepspeed_trainer_on_cpu() -> None:
    config = RunConfig.model_validate({"trainer": {"backend": "deepspeed", "zero_stage": 3, "cpu_ranks": 2}})
    placement = check_placement(config, 0)
    assert placement.trainer_world_size == 2 and placement.weight_sync_backend == "gloo"
    assert [placement.rank_env(rank, 1234)["LOCAL_RANK"] for rank in (0, 1)] == ["0", "1"]
    assert placement.rank_env(1, 1234)["CUDA_VISIBLE_DEVICES"] == ""
    with pytest.raises(PlacementError, match="cpu_ranks=2 needs trainer.backend 'deepspeed'"):
        check_placement(RunConfig.model_validate({"trainer": {"cpu_ranks": 2}}), 0)
    with pytest.raises(PlacementError, match="cpu_ranks=2 is for trainer.device 'cpu'"):
        check_placement(gpu_config(trainer={"cpu_ranks": 2}), 8)


def test_one_gpu_machine_shares_it_only_when_asked() -> None:
    one_each = {"inference": {"gpus_per_server": 1, "tensor_parallel_size": 1}, "trainer": {"gpus": 1}}
    with pytest.raises(PlacementError, match="needs 2 GPUs .* has 1"):
        check_placement(gpu_config(**one_each), 1)
    shared = gpu_config(inference=one_each["inference"], trainer={"gpus": 1, "share_inference_gpus": True})
    placement = check_placement(shared, 1)
    assert placement.servers[0].gpus == (0,) and placement.trainer_ranks[0].gpus == (0,)
    assert placement.gpus_used == 1 and placement.shared_gpus
    assert placement.weight_sync_backend == "gloo"  # NCCL refuses two ranks on one GPU
    with pytest.raises(PlacementError, match="only 1 GPU"):
        check_placement(gpu_config(inference=one_each["inference"], trainer={"gpus": 2, "share_inference_gpus": True}), 1)
    with pytest.raises(PlacementError, match="share_inference_gpus needs"):
        check_placement(RunConfig.model_validate({"trainer": {"share_inference_gpus": True}}), 0)
