"""Data-parallel training on torch.distributed (gloo, 2 processes on this machine, a file
rendezvous): each way of training data-parallel gives the parameters one process gets
training on the whole batch (thunderfn/testing/distributed_checks.py spawns the ranks).

The law: averaging each rank's gradient of its mean loss over its half of the batch is
the gradient of the mean loss over the whole batch, so after the same optimizer steps
every rank holds the single process's parameters."""
import pytest
import torch
import torch.distributed as dist

import thunderfn as tf
from thunderfn.testing import distributed_checks as checks
from thunderfn.testing.fusion_checks import needs_inductor

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="this torch build has no torch.distributed gloo backend")


def _assert_rank_results_match_one_process(results, accumulate=1, kinds=("sgd", "adamw")):
    for rank, result in enumerate(results):
        assert "exception" not in result, f"rank {rank}:\n{result.get('exception')}"
        for kind in kinds:
            for got, want in zip(result[kind], checks.reference(kind, accumulate=accumulate)):
                torch.testing.assert_close(got, want, msg=f"rank {rank}, {kind}")


def test_torchs_distributed_data_parallel_around_a_jitted_model_trains_like_one_process():
    _assert_rank_results_match_one_process(checks.run("torch_ddp_of_jit"))


def test_torchs_distributed_data_parallel_around_a_model_compiled_with_the_thunderfn_backend_trains_like_one_process():
    results = checks.run("torch_ddp_of_compiled")
    _assert_rank_results_match_one_process(results)
    report = results[0]["sgd_report"]  # thunderfn compiled the model's graph, whole
    assert "graph 0:" in report and "eager " not in report, report


def test_tf_ddp_trains_like_one_process_with_bucketed_async_all_reduces_in_the_backward_trace():
    results = checks.run("tf_ddp")
    _assert_rank_results_match_one_process(results)  # from different initial weights: rank 0's were broadcast
    backward = results[0]["sgd_backward"]
    # buckets of ~1 KB over 6 gradients (48..256 floats): several all-reduces, each started asynchronously
    # where its last gradient is produced and waited on at the end
    starts = backward.count("dist_all_reduce(")
    assert starts >= 2 and backward.count("dist_wait(") == starts
    lines = [line.strip() for line in backward.splitlines() if not line.lstrip().startswith("#")]
    first_start = next(i for i, line in enumerate(lines) if "dist_all_reduce(" in line)
    first_wait = next(i for i, line in enumerate(lines) if "dist_wait(" in line)
    assert any("torch.matmul" in line for line in lines[first_start:first_wait])  # compute overlaps communication


def test_no_sync_accumulates_locally_and_the_result_is_the_average_of_all_micro_batches():
    _assert_rank_results_match_one_process(checks.run("tf_ddp_no_sync"), accumulate=2, kinds=("adamw",))


def test_ranks_holding_different_models_are_refused_by_name_on_every_rank():
    results = checks.run("different_models")
    assert "parameter weight is (4, 4) torch.float32 on rank 0 but weight is (5, 4) torch.float32 on rank 1" \
        in results[0]["error"]
    assert "on rank 1 but" in results[1]["error"]


def test_jit_of_torchs_wrapper_is_refused_saying_which_way_round_to_wrap():
    for result in checks.run("refusals"):
        assert "DistributedDataParallel(tf.jit(model))" in result["error"]


@needs_inductor
def test_tf_ddp_with_a_fusion_executor_fuses_around_the_collectives_never_across():
    results = checks.run("fused_with_inductor")
    _assert_rank_results_match_one_process(results, kinds=("sgd",))
    backward = results[0]["sgd_backward"]
    assert "dist_all_reduce(" in backward and "inductor_fusion" in backward


def test_ddp_without_a_process_group_says_how_to_start_one():
    assert not dist.is_initialized()
    with pytest.raises(tf.errors.DistributedError, match=r"call torch.distributed.init_process_group\(backend\)"):
        tf.distributed.ddp(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("strategy, bucketing", [("FULL_SHARD", "none"), ("SHARD_GRAD_OP", "none"),
                                                 ("FULL_SHARD", "module")])
def test_fsdp_trains_like_one_process_keeping_a_shard_of_each_parameter(strategy, bucketing):
    scenario = "fsdp_full_shard" if strategy == "FULL_SHARD" else "fsdp_shard_grad_op"
    results = checks.run(scenario + ("_by_module" if bucketing == "module" else ""))
    # the whole parameters (tf.distributed.full_parameters) after SGD and AdamW steps on the shards
    _assert_rank_results_match_one_process(results)
    for result in results:
        sharded, whole = result["sgd_bytes"]
        assert sharded <= whole / 2 + 64  # 1/world of every parameter, plus padding to a multiple of world
        for got, want in zip(result["reloaded"], checks.reference("adamw")):
            torch.testing.assert_close(got, want)  # full_state_dict -> load_full_state_dict round trip
    forward, backward = results[0]["forward"], results[0]["backward"]
    assert "dist_all_gather(" in forward and "dist_reduce_scatter(" in backward
    # FULL_SHARD keeps only shards between forward and backward and gathers again where the backward
    # needs a whole parameter; SHARD_GRAD_OP keeps the gathered ones and communicates only gradients
    assert ("dist_all_gather(" in backward) == (strategy == "FULL_SHARD")
    # each gather comes right before the layer that uses it (not all up front), and the reduce-scatters
    # start asynchronously as each layer's gradients are complete, waited on at the return
    code = [line.strip() for line in forward.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    first_linear = next(i for i, line in enumerate(code) if "linear(" in line)
    assert any("dist_all_gather(" in line for line in code[first_linear:])
    bwd = [line.strip() for line in backward.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    starts = [i for i, line in enumerate(bwd) if "dist_reduce_scatter(" in line and "True)" in line]
    waits = [i for i, line in enumerate(bwd) if "dist_wait(" in line]
    assert starts and len(waits) == len(starts) and max(starts) < min(waits)
    assert any("matmul(" in line for line in bwd[min(starts):max(starts)])  # overlapped with computation
    # one all_gather and one reduce_scatter per parameter (6), or per Linear (3) with bucketing="module"
    gathers = [line for line in forward.splitlines() if "dist_all_gather(" in line
               and not line.lstrip().startswith("#")]
    assert len(gathers) == (3 if bucketing == "module" else 6)


def test_collectives_compose_with_jit_and_grad():
    results = checks.run("collectives_under_transforms")
    total = sum(torch.arange(3.0) + rank for rank in range(len(results)))
    for result in results:
        assert "exception" not in result, result.get("exception")
        torch.testing.assert_close(result["eager"], total)
        torch.testing.assert_close(result["jit"], 2 * total)
        # every rank computes the same sum over all shards: the gradient of each rank's own shard
        # sums the ranks' gradients of it (all_gather's transpose is a reduce_scatter)
        for key in ("grad", "jit_grad"):
            torch.testing.assert_close(result[key], 2 * len(results) * result["x"])
