"""The shipped accelerator catalog and price tables: content, validation, user overrides."""

import pandas as pd
import pytest

from kit.catalog import CatalogError, load_catalog

REQUIRED = ["MI300X", "MI325X", "MI355X", "H100", "H200", "B200", "B300", "CPU"]


def test_shipped_catalog_has_required_accelerators_and_fields():
    cat = load_catalog()
    for name in REQUIRED:
        row = cat.get(name)
        for col in ("hbm_gb", "hbm_tb_s", "fp32_tflops", "bf16_tflops", "gpus_per_node", "fp8_format"):
            assert pd.notna(row[col]), (name, col)
    assert cat.get("MI300X")["fp8_format"] == "e4m3fnuz"
    assert cat.get("MI355X")["fp8_format"] == "e4m3fn"
    assert cat.get("B300")["fp8_format"] == "e4m3fn"
    assert cat.get("mi355x")["hbm_gb"] == 288 and cat.get("H200 SXM")["name"] == "H200"
    assert cat.peak_tflops("MI355X", "bfloat16") == pytest.approx(2516.6)


def test_prices_by_basis():
    cat = load_catalog()
    assert cat.price("MI355X", "assumed-rental").usd_per_gpu_hr == 2.5
    assert cat.price("B300", "assumed-rental").usd_per_gpu_hr == 6.0
    assert cat.price("MI355X").basis == "tco"
    with pytest.raises(KeyError, match="no price for CPU"):
        cat.price("CPU")
    with pytest.raises(KeyError, match="unknown accelerator 'Z100'"):
        cat.get("Z100")


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


HEADER = "name,vendor,hbm_gb,hbm_tb_s,fp32_tflops,bf16_tflops,fp16_tflops,gpus_per_node,fp8_format\n"


def test_user_file_adds_and_overrides(tmp_path):
    acc = _write(
        tmp_path,
        "acc.csv",
        HEADER + "MyGPU,Acme,96,4.0,50,900,900,8,e4m3fn\nH200,NVIDIA,141,5.0,67,989.4,989.4,8,e4m3fn\n",
    )
    pr = _write(tmp_path, "p.csv", "accelerator,usd_per_gpu_hr,basis\nMyGPU,1.1,rental\nH200,2.0,tco\n")
    cat = load_catalog(acc, pr)
    assert cat.get("MyGPU")["hbm_gb"] == 96 and cat.get("H200")["hbm_tb_s"] == 5.0
    assert cat.price("MyGPU", "rental").usd_per_gpu_hr == 1.1
    assert cat.price("H200", "tco").usd_per_gpu_hr == 2.0


@pytest.mark.parametrize(
    "row,match",
    [
        ("Bad,Acme,-5,4.0,50,900,900,8,e4m3fn", "hbm_gb=-5"),
        ("Bad,Acme,96,fast,50,900,900,8,e4m3fn", "hbm_tb_s='fast' is not a number"),
        ("Bad,Acme,96,4.0,50,900,900,8,e5m2", "fp8_format='e5m2'"),
    ],
)
def test_validation_names_the_bad_value(tmp_path, row, match):
    with pytest.raises(CatalogError, match=match):
        load_catalog(_write(tmp_path, "acc.csv", HEADER + row + "\n"))


def test_validation_missing_column_and_unknown_price_target(tmp_path):
    with pytest.raises(CatalogError, match="missing column"):
        load_catalog(_write(tmp_path, "a.csv", "name,vendor\nX,Y\n"))
    with pytest.raises(CatalogError, match="accelerator='Nope' is not in the catalog"):
        load_catalog(extra_prices=_write(tmp_path, "p.csv", "accelerator,usd_per_gpu_hr,basis\nNope,1,tco\n"))
    with pytest.raises(CatalogError, match="more than one price"):
        load_catalog(extra_prices=_write(tmp_path, "p.csv", "accelerator,usd_per_gpu_hr,basis\nH100,1,x\nH100,2,x\n"))


def test_user_paths_must_be_files_and_parse_errors_name_the_file(tmp_path, capsys):
    from kit.cli import main

    for kw in ("extra_accelerators", "extra_prices"):
        with pytest.raises(CatalogError, match=f"{tmp_path}: is a directory"):
            load_catalog(**{kw: tmp_path})
        with pytest.raises(FileNotFoundError, match="nope.csv"):
            load_catalog(**{kw: tmp_path / "nope.csv"})
    bad = tmp_path / "bad.csv"
    bad.write_text('accelerator,usd_per_gpu_hr,basis\nB300,1,x,4,5\n"unterminated\n')
    with pytest.raises(CatalogError, match=rf"{bad}: cannot parse as CSV: .*Error tokenizing data"):
        load_catalog(extra_prices=bad)
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(CatalogError, match=rf"{empty}: cannot parse as CSV: No columns to parse"):
        load_catalog(extra_accelerators=empty)
    for argv in (
        ["devices", "--accelerators", str(tmp_path)],
        ["devices", "--prices", str(tmp_path)],
        ["plan", "--model", "llama-3.1-8b", "--accelerator", "b300", "--prices", str(tmp_path)],
    ):
        assert main(argv) == 2, argv
        assert f"{tmp_path}: is a directory" in capsys.readouterr().err


def _user_csv(tmp_path, **over):
    import pandas as pd

    from kit._io import data_path

    row = pd.read_csv(data_path("accelerators.csv")).set_index("name").loc["MI355X"].to_dict()
    row.update(over)
    p = tmp_path / "acc.csv"
    pd.DataFrame([{"name": over.get("name", "MI355X"), **{k: v for k, v in row.items() if k != "name"}}]).to_csv(
        p, index=False
    )
    return p


@pytest.mark.parametrize(
    "col,value,match",
    [
        ("hbm_tb_s", "inf", "hbm_tb_s='?inf'? must be a finite number > 0"),
        ("bf16_tflops", float("nan"), "is not a number|must be a finite"),
        ("gpus_per_node", 7.5, "gpus_per_node=7.5 must be a whole number"),
        ("tdp_w", "-inf", "tdp_w='?-inf'? must be a finite number >= 0"),
    ],
)
def test_user_rows_need_finite_whole_values(tmp_path, col, value, match):
    with pytest.raises(CatalogError, match=match):
        load_catalog(_user_csv(tmp_path, **{col: value}))


def test_a_user_row_overrides_the_shipped_one_case_insensitively(tmp_path):
    cat = load_catalog(_user_csv(tmp_path, name="mi355x", hbm_gb=300))
    assert cat.get("MI355X")["hbm_gb"] == 300 and sum(n.lower() == "mi355x" for n in cat.names) == 1
    assert cat.price("mi355x", "tco").usd_per_gpu_hr > 0  # the shipped prices still find it
    prices = tmp_path / "p.csv"
    prices.write_text("accelerator,usd_per_gpu_hr,basis\nmi355x,9.5,user\n")
    assert load_catalog(extra_prices=prices).price("MI355X", "user").usd_per_gpu_hr == 9.5
    prices.write_text("accelerator,usd_per_gpu_hr,basis\nMI355X,inf,user\n")
    with pytest.raises(CatalogError, match="usd_per_gpu_hr='inf' must be a finite number > 0|must be a finite"):
        load_catalog(extra_prices=prices)
