"""The network comparison's pure parts: the networks' inputs, the traffic in each system's request shape (the OIP
binary body as the binary-extension spec lays it out, answers read back), the parity judge, and how compare picks a
network's systems. No server."""

import dataclasses
import json

import numpy as np
import pytest
import torch

from loadtests import compare, network_traffic, networks, payloads
from loadtests.baselines import network_peers


def split_oip(raw):
    """A binary-extension body: (its JSON header, the bytes after it)."""
    length = int(dict(raw.headers)[network_traffic.OIP_HEADER])
    return json.loads(raw.data[:length]), raw.data[length:]


def test_each_network_draws_its_inputs_with_their_shapes_dtypes_and_id_ranges():
    for spec in networks.NETWORKS.values():
        drawn = network_traffic.draw_request(spec, np.random.default_rng(3), rows=5)
        assert list(drawn) == [tensor.name for tensor in spec.inputs]
        for tensor in spec.inputs:
            array = drawn[tensor.name]
            assert array.shape == (5, *tensor.shape) and array.dtype == np.dtype(tensor.dtype)
            if tensor.ids:
                assert array.min() >= 0 and array.max() < tensor.ids
    ranking = network_traffic.draw_request(networks.network("ranking"), np.random.default_rng(3))
    assert ranking["features"].std() > 0.5  # standard normal features, not a constant


def test_oip_body_is_the_binary_extension_layout_with_every_input_in_order():
    tensors = network_traffic.draw_request(networks.network("ranking"), np.random.default_rng(1), rows=2)
    body = network_traffic.oip_request(tensors)
    header, binary = split_oip(body)
    assert body.content_type == network_traffic.OIP_CONTENT_TYPE
    assert [i["name"] for i in header["inputs"]] == ["user_id", "item_ids", "features"]
    assert [i["datatype"] for i in header["inputs"]] == ["INT64", "INT64", "FP32"]
    assert [i["shape"] for i in header["inputs"]] == [[2, 1], [2, 8], [2, 16]]
    assert header["parameters"]["binary_data_output"] is True  # tritonclient's default: answers in binary too
    sizes = [i["parameters"]["binary_data_size"] for i in header["inputs"]]
    assert binary == b"".join(array.tobytes() for array in tensors.values())
    assert sizes == [array.nbytes for array in tensors.values()]


def test_oip_answers_binary_and_json_are_read_back_as_arrays():
    logits = np.random.default_rng(2).standard_normal((1, 1000), dtype=np.float32)
    head = {"outputs": [{"name": "logits", "datatype": "FP32", "shape": [1, 1000]}]}
    head["outputs"][0]["parameters"] = {"binary_data_size": logits.nbytes}
    encoded = json.dumps(head).encode()
    read = network_traffic.oip_answer(encoded + logits.tobytes(), {network_traffic.OIP_HEADER: str(len(encoded))})
    assert np.array_equal(read["logits"], logits)
    plain = {"outputs": [{"name": "scores", "datatype": "FP32", "shape": [1, 2], "data": [0.5, -1.0]}]}
    read = network_traffic.oip_answer(json.dumps(plain).encode(), {})
    assert read["scores"].tolist() == [[0.5, -1.0]]


def test_json_bodies_carry_exactly_the_drawn_float32_values():
    tensors = network_traffic.draw_request(networks.network("ranking"), np.random.default_rng(4))
    sent = json.loads(json.dumps(network_traffic.json_request(tensors)))
    assert np.array_equal(np.asarray(sent["features"], dtype=np.float32), tensors["features"])
    assert sent["item_ids"] == tensors["item_ids"].tolist()
    assert network_traffic.json_answer(b'{"scores": [[1.5, 2.0]]}', {})["scores"].shape == (1, 2)
    with pytest.raises(ValueError):
        network_traffic.json_answer(b"[1, 2]", {})


def test_traffic_names_resolve_to_each_systems_path_and_reader():
    oip = payloads.traffic("ranking-oip")
    assert oip.path == "/v2/models/ranking/infer" and oip.decode is network_traffic.oip_answer
    assert payloads.traffic("resnet50-size-litserve").path == "/predict"
    assert payloads.traffic("resnet50-size-torchserve").path == "/predictions/resnet50-size"
    assert network_traffic.parse_name("ranking-grpc") is None and network_traffic.parse_name("minilm") is None
    assert network_peers.traffic_for("pytriton", "ranking") == "ranking-oip"
    assert network_peers.traffic_for("ours", "ranking") == "ranking-oip"  # ours is measured with Triton's client
    body = oip.payloads(0, 1).next()
    assert payloads.request_headers(body) == dict(body.headers) and network_traffic.OIP_HEADER in body.headers[0]
    assert payloads.request_headers({"text": "hi"}) == {}


def test_payload_streams_are_seeded_per_stream():
    first = [payloads.traffic("ranking-oip").payloads(0, 1).next().data for _ in range(3)]
    again = [payloads.traffic("ranking-oip").payloads(0, 1).next().data for _ in range(3)]
    other = payloads.traffic("ranking-oip").payloads(0, 2)
    assert first == again
    assert {other.next().data for _ in range(20)} != {first[0]}
    assert len({body.data for body in payloads.traffic("ranking-oip").payloads(0, 1).pool}) == network_traffic.POOL


def test_answer_of_reads_json_or_the_traffics_own_format_and_reports_unreadable_answers_as_value_errors():
    assert payloads.answer_of(payloads.traffic("classifier"), b'{"label": 1}', {}) == {"label": 1}
    oip = payloads.traffic("ranking-oip")
    with pytest.raises(ValueError):  # the locustfile counts a ValueError as an unreadable answer, not a crash
        payloads.answer_of(oip, b"not json", {})

    def lost(content, headers):
        raise KeyError("outputs")

    odd = dataclasses.replace(oip, decode=lost)  # a reader's own error type is an unreadable answer too
    with pytest.raises(ValueError, match="unreadable answer: KeyError"):
        payloads.answer_of(odd, b"{}", {})
    check = oip.check
    assert check({"scores": np.zeros((1, 8), dtype=np.float32)}) is None
    assert "shape" in check({"scores": np.zeros((1, 7), dtype=np.float32)})
    assert "no output" in check({"logits": np.zeros((1, 8), dtype=np.float32)})
    assert "not finite" in check({"scores": np.full((1, 8), np.nan, dtype=np.float32)})


def test_judge_accepts_fp32_noise_and_names_any_real_difference():
    reference = {"logits": np.random.default_rng(5).standard_normal((1, 1000)).astype(np.float32) * 3}
    assert network_traffic.judge(reference, {"logits": reference["logits"].copy()}) is None
    assert network_traffic.judge(reference, {"logits": reference["logits"] * (1 + 1e-6)}) is None
    shifted = reference["logits"].copy()
    shifted[0, 7] += 0.01
    assert "logits: differs by up to 0.01" in network_traffic.judge(reference, {"logits": shifted})
    assert "shape" in network_traffic.judge(reference, {"logits": reference["logits"][:, :999]})
    assert "outputs" in network_traffic.judge(reference, {"scores": reference["logits"]})
    broken = reference["logits"].copy()
    broken[0, 0] = np.nan
    assert "finite" in network_traffic.judge(reference, {"logits": broken})


def test_compare_offers_a_network_its_peers_ours_at_both_precisions_the_ceiling_and_the_ideal():
    systems, rate = compare.default_systems("ranking", None)
    assert systems == list(network_peers.NETWORK_SYSTEMS) and rate == networks.network("ranking").moderate_rate
    for name in ("ours", "ours-fp32", "ours-json", "pytriton", "ideal", "inprocess"):
        assert compare.system_exists(name, "resnet50-size", None)
    assert not compare.system_exists("litserve", "minilm", None)  # the peers exist for the networks only
    assert not compare.system_exists("ours-fp32", "minilm", None)


def test_network_targets_compare_ours_with_the_best_peer_at_the_targets_slo():
    def entry(rate, slo=500.0):
        return {"capacity_rate": rate, "slo_ms": slo}

    results = {
        "ours": entry(30.0),
        "ours-fp32": entry(12.0),
        "torchserve-network": entry(4.0),
        "litserve": entry(10.0),
        "pytriton": entry(None),
        "ideal": {"capacity_rate": 32.0},
    }
    verdicts = {v["target"].split(" >=")[0]: v for v in compare.evaluate_targets("resnet50-size", results)}
    assert verdicts["ours / best peer"]["value"] == 3.0 and verdicts["ours / best peer"]["met"]  # litserve is best
    assert verdicts["ours fp32 / best peer (fp32)"]["value"] == 1.2 and verdicts["ours fp32 / best peer (fp32)"]["met"]
    assert verdicts["ours / ideal"]["value"] == round(30 / 32, 3) and verdicts["ours / ideal"]["met"]
    results["ours"] = entry(19.0)
    assert not compare.evaluate_targets("resnet50-size", results)[0]["met"]
    # A run at another SLO is not judged against the target's.
    missed = compare.evaluate_targets("ranking", {**results, "ours": entry(100.0, slo=100.0)})
    assert missed[0]["met"] is None and "not the target's 50 ms" in missed[0]["note"]
    assert compare.evaluate_targets("ranking", {})[0]["note"] == "not measured"
    # Ours is judged in its faster request form: sent its native JSON, the same archive served more.
    both = {**results, "ours": entry(19.0), "ours-json": entry(40.0)}
    peers = compare.evaluate_targets("resnet50-size", both)[0]
    assert peers["value"] == 4.0 and peers["met"] and peers["note"].startswith("ours-json 40.0/s")


def test_ranking_folder_exports_dynamic_rows_equal_to_the_module(tmp_path):
    folder = networks.build_folder("ranking", tmp_path, log=lambda *_: None)
    described = json.loads((folder / networks.RECORD).read_text())
    assert [i["name"] for i in described["inputs"]] == ["user_id", "item_ids", "features"]
    program = torch.export.load(str(folder / networks.PROGRAM)).module()
    traced = torch.jit.load(str(folder / networks.TORCHSCRIPT))
    module = networks.build_module("ranking")
    spec = networks.network("ranking")
    for rows in (1, 5):
        tensors = network_traffic.draw_request(spec, np.random.default_rng(rows), rows)
        expected = network_traffic.reference_answers(spec, module, [tensors])[0]
        with torch.no_grad():
            exported = program(*networks.as_tensors(tensors))["scores"].numpy()
            scripted = traced(*networks.as_tensors(tensors)).numpy()
        assert exported.shape == (rows, 8)
        assert network_traffic.judge(expected, {"scores": exported}) is None
        assert network_traffic.judge(expected, {"scores": scripted}) is None
