"""--devices and --reduce-device: parsing, resolution, and their errors."""

import re

import pytest
from conftest import flag_message

from engine.topology.devices import (
    DeviceError,
    DeviceRequest,
    canonical,
    parse_request,
    resolve,
    task_of,
)
from engine.topology.splits import logical_gpu_map

CPU2 = ["/cpu:0", "/cpu:1"]
GPU4 = ["/cpu:0", "/gpu:0", "/gpu:1", "/gpu:2", "/gpu:3"]


@pytest.mark.parametrize(
    "name, expected",
    [
        ("/gpu:1", "/gpu:1"),
        ("/GPU:1", "/gpu:1"),
        ("/device:GPU:1", "/gpu:1"),
        ("/job:localhost/replica:0/task:0/device:CPU:3", "/cpu:3"),
        ("/cpu:0", "/cpu:0"),
        ("gpu:1", None),
        ("/tpu:0", None),
        ("/job:worker/task:1/device:GPU:0", "/job:worker/task:1/gpu:0"),
        ("/job:worker/replica:0/task:1/device:CPU:2", "/job:worker/task:1/cpu:2"),
        ("w1/gpu:0", "/job:worker/task:1/gpu:0"),
        ("W0/CPU:1", "/job:worker/task:0/cpu:1"),
        ("/job:chief/replica:0/task:0/device:CPU:0", "/cpu:0"),
        ("/job:chief/task:1/device:CPU:0", "/job:chief/task:1/cpu:0"),
        ("w1:gpu:0", None),
        ("/job:bad job/cpu:0", None),
    ],
)
def test_canonical_names(name, expected):
    assert canonical(name) == expected


def test_gpu_indices_become_gpu_towers_in_order():
    request = parse_request("2,0,1")
    assert request.towers == ("/gpu:2", "/gpu:0", "/gpu:1")
    assert request.logical_cpus is None


def test_cpu_split_makes_n_logical_cpu_towers():
    request = parse_request("cpu:4")
    assert request.towers == ("/cpu:0", "/cpu:1", "/cpu:2", "/cpu:3")
    assert request.logical_cpus == 4


def test_gpu_split_makes_n_logical_gpu_towers_on_gpu_0():
    request = parse_request("gpu:4")
    assert request.towers == ("/gpu:0", "/gpu:1", "/gpu:2", "/gpu:3")
    assert (request.logical_gpus, request.logical_cpus) == (4, None)
    assert request.gpu_memory_mb == 4096
    assert parse_request("GPU:2", None, 1500).gpu_memory_mb == 1500


def test_logical_gpus_read_through_their_physical_gpu():
    """GPU 0 split in three on a host with two GPUs: TensorFlow numbers the
    logical GPUs first; DALI's device_id is the physical GPU."""
    assert logical_gpu_map(3, 2) == {"/gpu:0": 0, "/gpu:1": 0, "/gpu:2": 0, "/gpu:3": 1}
    visible = ["/cpu:0", "/gpu:0", "/gpu:1", "/gpu:2", "/gpu:3"]
    placement = resolve(parse_request("2,3,0"), visible, logical_gpu_map(3, 2))
    assert [t.gpu_index for t in placement.towers] == [0, 1, 0]
    assert placement.shared_gpus() == {0: ["/gpu:2", "/gpu:0"]}
    assert resolve(parse_request("0,1"), GPU4).shared_gpus() == {}


def test_all_defers_to_what_exists():
    assert parse_request("all") == DeviceRequest(towers=None)
    assert resolve(parse_request("all"), GPU4).devices == (
        "/gpu:0", "/gpu:1", "/gpu:2", "/gpu:3"
    )
    assert resolve(parse_request("all"), CPU2).devices == ("/cpu:0", "/cpu:1")


def test_explicit_names_mix_with_indices():
    placement = resolve(parse_request("/gpu:1, 3", "/gpu:0"), GPU4)
    assert placement.devices == ("/gpu:1", "/gpu:3")
    assert placement.reduce_device == "/gpu:0"
    assert [t.gpu_index for t in placement.towers] == [1, 3]
    assert [(t.index, t.num_towers) for t in placement.towers] == [(0, 2), (1, 2)]


def test_reduce_device_defaults_to_the_first_gpu_tower_else_host_cpu():
    """Every tower a local GPU: the first tower's GPU; any CPU or remote tower: /cpu:0."""
    assert resolve(parse_request("0,1"), GPU4).reduce_device == "/gpu:0"
    assert resolve(parse_request("2,1"), GPU4).reduce_device == "/gpu:2"
    assert resolve(parse_request("/gpu:0,/cpu:0"), GPU4).reduce_device == "/cpu:0"
    assert resolve(parse_request("0,1", "/cpu:0"), GPU4).reduce_device == "/cpu:0"


@pytest.mark.parametrize(
    "spec, message",
    [
        ("", r"^--devices is empty; give GPU indices"),
        ("   ", r"^--devices is empty"),
        ("0,1,0", r"^--devices '0,1,0': /gpu:0 is listed twice"),
        ("/cpu:1,/device:CPU:1", r"/cpu:1 is listed twice"),
        ("cpu:0", r"^--devices 'cpu:0': N must be at least 1 for cpu:N, got 0"),
        ("cpu:-2", r"N must be at least 1 for cpu:N, got -2"),
        ("0,x", r"^--devices '0,x': 'x' is not a GPU index or a device name"),
        ("cpu:2,0", r"'cpu:2' splits a device into logical ones and stands alone; give it once "
                    r"\('cpu:2'\), or list devices by name \(/cpu:0,/cpu:1\)"),
        ("cpu:2,cpu:2", r"'cpu:2' splits a device into logical ones and stands alone"),
        ("gpu:0", r"^--devices 'gpu:0': N must be at least 1 for gpu:N, got 0$"),
    ],
)
def test_malformed_specs_are_refused_with_the_value(spec, message):
    with pytest.raises(DeviceError) as err:
        parse_request(spec)
    assert re.search(message, flag_message(err.value))


@pytest.mark.parametrize(
    "devices, memory, message",
    [
        ("cpu:2", 2048, "--gpu-memory 2048 sets the memory of each logical GPU of "
         "--devices gpu:N; add --devices gpu:N or drop --gpu-memory"),
        ("gpu:2", 0, "--gpu-memory (0) must be at least 1 (MiB)"),
    ],
)
def test_gpu_memory_belongs_to_a_gpu_split(devices, memory, message):
    with pytest.raises(DeviceError) as err:
        parse_request(devices, None, memory)
    assert flag_message(err.value) == message


def test_bad_reduce_device_name_is_refused():
    with pytest.raises(DeviceError) as err:
        parse_request("cpu:2", "gpu0")
    assert re.search(r"^--reduce-device 'gpu0' is not a device name", flag_message(err.value))


def test_missing_gpu_lists_devices_that_exist():
    with pytest.raises(DeviceError) as err:
        resolve(parse_request("0,1"), ["/cpu:0"])
    assert flag_message(err.value) == (
        "--devices: GPU 0 does not exist; devices here: /cpu:0 "
        "(no GPU here: use --devices cpu:N for N CPU towers)"
    )


def test_unknown_gpu_index_on_a_gpu_machine():
    with pytest.raises(DeviceError) as err:
        resolve(parse_request("3,4"), GPU4)
    assert flag_message(err.value) == (
        "--devices: GPU 4 does not exist; devices here: "
        "/cpu:0, /gpu:0, /gpu:1, /gpu:2, /gpu:3"
    )


def test_missing_reduce_device_lists_devices_that_exist():
    with pytest.raises(DeviceError) as err:
        resolve(parse_request("cpu:2", "/cpu:2"), CPU2)
    assert flag_message(err.value) == (
        "--reduce-device /cpu:2 does not exist; devices here: /cpu:0, /cpu:1"
    )


def test_all_with_a_cluster_means_the_workers_devices():
    visible = ["/cpu:0", "/job:worker/task:0/cpu:0", "/job:worker/task:1/cpu:0",
               "/job:worker/task:1/cpu:1"]
    placement = resolve(parse_request("all"), visible)
    assert placement.devices == tuple(visible[1:])
    assert placement.reduce_device == "/cpu:0"
    with_gpus = [*visible, "/job:worker/task:1/gpu:0"]
    assert resolve(parse_request("all"), with_gpus).devices == ("/job:worker/task:1/gpu:0",)


def test_remote_towers_keep_their_gpu_ordinal_and_task():
    placement = resolve(parse_request("w1/gpu:1,w0/cpu:0", "w0/cpu:0"),
                        ["/cpu:0", "/job:worker/task:0/cpu:0", "/job:worker/task:1/gpu:1"])
    assert [t.gpu_index for t in placement.towers] == [1, None]
    assert [task_of(t.device) for t in placement.towers] == ["/job:worker/task:1",
                                                             "/job:worker/task:0"]
    assert placement.reduce_device == "/job:worker/task:0/cpu:0"


def test_missing_remote_device_asks_about_the_cluster():
    with pytest.raises(DeviceError) as err:
        resolve(parse_request("w2/cpu:0"), ["/cpu:0", "/job:worker/task:0/cpu:0"])
    assert flag_message(err.value) == (
        "--devices: /job:worker/task:2/cpu:0 does not exist; devices here: /cpu:0, "
        "/job:worker/task:0/cpu:0 (is /job:worker/task:2 in the cluster? tower-worker "
        "--cpus N gives a worker N CPU devices)"
    )


def test_splitting_again_is_fine_only_for_the_same_count():
    """conftest split the CPU into eight at import; listing them initialises
    TensorFlow, which then refuses another split."""
    import tensorflow as tf
    from conftest import LOGICAL_CPUS

    from engine.topology.splits import split_host_cpu

    assert len(tf.config.list_logical_devices("CPU")) == LOGICAL_CPUS
    split_host_cpu(LOGICAL_CPUS)  # what is there already: no error
    with pytest.raises(DeviceError) as err:
        split_host_cpu(3)
    assert flag_message(err.value) == (
        f"cannot split the CPU into 3 devices: TensorFlow is already initialised with "
        f"{LOGICAL_CPUS}; split once per process, before use"
    )
