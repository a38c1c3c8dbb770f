"""kit.visibility: CUDA_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES and ROCR_VISIBLE_DEVICES resolved to physical device
indices by one function (issue 22), with conflicts, out-of-range selections and malformed lists as UserErrors."""

import pytest

from kit.errors import UserError
from kit.visibility import physical_gpus, resolve_visible_devices, visible_devices


@pytest.mark.parametrize(
    "platform, env, physical",
    [
        ("rocm", {"ROCR_VISIBLE_DEVICES": "2,3", "HIP_VISIBLE_DEVICES": "1"}, [3]),  # issue 22's case: GPU 3, not 1
        ("rocm", {"ROCR_VISIBLE_DEVICES": "4,5,6,7", "HIP_VISIBLE_DEVICES": "3,0"}, [7, 4]),
        ("rocm", {"ROCR_VISIBLE_DEVICES": "4,5", "CUDA_VISIBLE_DEVICES": "1"}, [5]),  # HIP reads CUDA's list too
        ("rocm", {"ROCR_VISIBLE_DEVICES": " 6, 2 "}, [6, 2]),
        ("rocm", {"HIP_VISIBLE_DEVICES": "1,0", "CUDA_VISIBLE_DEVICES": "1, 0"}, [1, 0]),  # the same list twice
        ("rocm", {"ROCR_VISIBLE_DEVICES": "GPU-4e8f1a2b", "HIP_VISIBLE_DEVICES": "0"}, ["GPU-4e8f1a2b"]),
        ("rocm", {}, None),
        ("cuda", {"CUDA_VISIBLE_DEVICES": "3,1", "ROCR_VISIBLE_DEVICES": "0", "HIP_VISIBLE_DEVICES": "0"}, [3, 1]),
        ("cuda", {"CUDA_VISIBLE_DEVICES": ""}, []),  # hides every GPU: the CPU, not an error
        ("cuda", {"CUDA_VISIBLE_DEVICES": "GPU-8a1b2c3d-aaaa-bbbb-cccc-0123456789ab"},
         ["GPU-8a1b2c3d-aaaa-bbbb-cccc-0123456789ab"]),
        ("cuda", {"HIP_VISIBLE_DEVICES": "1"}, None),  # ignored by CUDA
        ("cpu", {"CUDA_VISIBLE_DEVICES": "1"}, None),
    ],
)  # fmt: skip
def test_visible_devices_resolve_to_physical_indices(platform, env, physical):
    assert resolve_visible_devices(platform, env) == physical
    assert visible_devices(platform, env)["physical"] == physical


@pytest.mark.parametrize(
    "env, match",
    [
        ({"ROCR_VISIBLE_DEVICES": "1", "HIP_VISIBLE_DEVICES": "1"},  # leaves no device
         r"HIP_VISIBLE_DEVICES='1' selects device 1, but ROCR_VISIBLE_DEVICES='1' leaves 1 device\(s\) \(indices 0 to"),
        ({"ROCR_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": "0"}, r"ROCR_VISIBLE_DEVICES='' leaves 0 device\(s\)"),
        ({"ROCR_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": "2"}, "CUDA_VISIBLE_DEVICES='2' selects device 2"),
        ({"HIP_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "1"}, "HIP_VISIBLE_DEVICES='0' and CUDA_VISIBLE_DE"),
        ({"ROCR_VISIBLE_DEVICES": "0,,1"}, "ROCR_VISIBLE_DEVICES='0,,1': item '' is not a device index"),
        ({"HIP_VISIBLE_DEVICES": "-1"}, "item '-1' is not a device index"),
        ({"ROCR_VISIBLE_DEVICES": "2,2"}, "names device 2 twice"),
    ],
)  # fmt: skip
def test_conflicts_and_empty_selections_are_errors(env, match):
    with pytest.raises(UserError, match=match):
        resolve_visible_devices("rocm", env)


def test_explanations_say_why():
    v = visible_devices("rocm", {"ROCR_VISIBLE_DEVICES": "0,1,2,3", "HIP_VISIBLE_DEVICES": "1"})
    assert v["explanation"] == (
        "ROCR_VISIBLE_DEVICES='0,1,2,3' filters first; HIP_VISIBLE_DEVICES='1' selects from what is left; "
        "physical devices [1]"
    )
    assert (
        "CUDA_VISIBLE_DEVICES (read by HIP)='2'"
        in visible_devices("rocm", {"CUDA_VISIBLE_DEVICES": "2"})["explanation"]
    )
    cuda = visible_devices("cuda", {"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": "0"})
    assert "selects no device" in cuda["explanation"] and "ignored by a CUDA build" in cuda["explanation"]
    assert "every GPU is hidden" in cuda["explanation"]
    assert visible_devices("cuda", {})["explanation"] == "no visibility variable set: every device is visible"
    assert "change nothing" in visible_devices("cpu", {"HIP_VISIBLE_DEVICES": "0"})["explanation"]


def test_physical_gpus_of_a_point_and_of_tp_ranks():
    env = {"ROCR_VISIBLE_DEVICES": "4,5,6,7", "HIP_VISIBLE_DEVICES": "2,3"}
    assert physical_gpus("rocm", 1, env) == [6] and physical_gpus("rocm", 2, env) == [6, 7]
    assert physical_gpus("cuda", 2, {}) == [0, 1] and physical_gpus("cpu", 4, env) is None
    with pytest.raises(UserError, match="3 GPU\\(s\\) needed but the visibility variables leave 2"):
        physical_gpus("rocm", 3, env)
