"""The fabric as the nodes tell it (decide/fabricfind.py), on recorded outputs of the real tools: ibnetdiscover
(infiniband-diags), lldpctl -f json (lldpd: one interface, and several with the two chassis forms), nvidia-smi -q
(an NVLink domain of GB200s, and H100s outside any); and its comparison with the declared topology."""

from __future__ import annotations

from pathlib import Path

from ftconsole.scheduler.decide.fabricfind import (
    compare,
    found_fabric,
    read_ibnetdiscover,
    read_lldp,
    read_nvlink_domain,
)

GOLDEN = Path(__file__).parent / "golden" / "topology"


def golden(name: str) -> str:
    return (GOLDEN / name).read_text()


def test_ibnetdiscover_gives_each_hosts_leaf_and_the_switches_above() -> None:
    ib = read_ibnetdiscover(golden("ibnetdiscover.txt"))
    assert ib.leaf_of == {"gpu01": "leaf01", "gpu02": "leaf01", "gpu03": "leaf02", "gpu04": "leaf02"}
    assert ib.uplinks == {"spine01": {"leaf01", "leaf02"}, "leaf01": {"spine01"}, "leaf02": {"spine01"}}


def test_lldpctl_names_each_interfaces_neighbour() -> None:
    assert read_lldp(golden("lldpctl-one.json")) == {"eth0": "roce-leaf-07"}
    assert read_lldp(golden("lldpctl-two.json")) == {"ens1f0np0": "roce-leaf-08", "ens1f1np1": "roce-leaf-09"}
    assert read_lldp("") == {} and read_lldp('{"lldp": {}}') == {}


def test_nvidia_smi_names_the_nvlink_domain_where_there_is_one() -> None:
    assert read_nvlink_domain(golden("nvidia-smi-q-nvl72.txt")) == "8c4a3f02-6b1e-4e0a-9d55-0f2b7e13a0c4/32766"
    assert read_nvlink_domain(golden("nvidia-smi-q-h100.txt")) is None
    assert read_nvlink_domain("") is None


def test_what_is_found_is_compared_with_what_is_declared() -> None:
    ib = read_ibnetdiscover(golden("ibnetdiscover.txt"))
    hosts = {"gpu01": "10.1.0.1", "gpu02": "10.1.0.2", "gpu03": "10.1.0.3", "gpu04": "10.1.0.4", "gpu05": "10.1.0.5"}
    lldp = {"gpu05": read_lldp(golden("lldpctl-one.json"))}
    nvl = {"gpu01": "u/1", "gpu02": "u/1"}
    found = found_fabric(hosts, ib, lldp, nvl)
    assert found.leaf_of == {"gpu01": "leaf01", "gpu02": "leaf01", "gpu03": "leaf02", "gpu04": "leaf02",
                             "gpu05": "roce-leaf-07"}  # fmt: skip
    assert found.source["gpu05"] == "lldp" and found.source["gpu01"] == "ibnetdiscover"
    assert found.to_json()["nvlink_domains"] == {"u/1": ["gpu01", "gpu02"]}
    nodes = sorted(hosts)
    same = {"gpu01": "a", "gpu02": "a", "gpu03": "b", "gpu04": "b", "gpu05": "c"}  # other names, same groups
    rack = {"gpu01": "nvl1", "gpu02": "nvl1"}  # the NVLink domain, declared as a block
    assert compare(same, found, nodes, rack) == []
    assert compare(same, found, nodes) == [
        "gpu01 is in NVLink domain u/1 (nvidia-smi) and in no block in topology:",
        "gpu02 is in NVLink domain u/1 (nvidia-smi) and in no block in topology:",
    ]
    split = compare(same, found, nodes, {"gpu01": "nvl1", "gpu02": "nvl2"})
    assert split[0] == "gpu01 is declared in nvl1 but found in NVLink domain u/1 (nvidia-smi): with gpu02"
    wrong = {"gpu01": "a", "gpu02": "b", "gpu03": "b", "gpu04": "b"}
    said = compare(wrong, found, nodes, rack)
    assert (
        "gpu02 is declared under b but found under switch leaf01 (ibnetdiscover): with gpu01; not with gpu03, gpu04"
        in said
    )
    assert "gpu05 is under switch roce-leaf-07 (lldp) and under no leaf in topology:" in said
    assert len(said) == 5  # gpu01 (its leaf lacks gpu02), gpu02, gpu03 and gpu04 (theirs has gpu02), gpu05


def test_switches_that_share_a_description_stay_apart_and_odd_shapes_read_as_nothing() -> None:
    """(review) Unnamed switches all describe themselves alike: each keeps its GUID. lldpctl output in a shape
    nobody foresaw reads as no neighbour, never an error."""
    text = golden("ibnetdiscover.txt").replace("MF0;leaf01:MQM9700/U1", "Quantum Mellanox Technologies")
    text = text.replace("MF0;leaf02:MQM9700/U1", "Quantum Mellanox Technologies")
    ib = read_ibnetdiscover(text)
    assert ib.leaf_of["gpu01"] == ib.leaf_of["gpu02"] != ib.leaf_of["gpu03"] == ib.leaf_of["gpu04"]
    assert ib.leaf_of["gpu01"] == "Quantum Mellanox Technologies (b83fd20300e41b00)"
    for odd in ('{"lldp": []}', "[1, 2]", '"text"', '{"lldp": {"interface": [1, "x"]}}', "null"):
        assert read_lldp(odd) == {}, odd


def test_lldp_takes_the_neighbour_of_an_interface_that_carries_rdma() -> None:
    """(review) The management network's switch is not the fabric's: where the node says which interfaces carry
    RDMA (RoCE), their neighbour names its leaf."""
    two = read_lldp(golden("lldpctl-two.json"))  # ens1f0np0 -> roce-leaf-08, ens1f1np1 -> roce-leaf-09
    plain = found_fabric({"n1": "10.0.0.1"}, None, {"n1": two}, {})
    assert plain.leaf_of == {"n1": "roce-leaf-08"}  # the first interface in name order
    roce = found_fabric({"n1": "10.0.0.1"}, None, {"n1": two}, {}, {"n1": ["mlx5_x", "ens1f1np1"]})
    assert roce.leaf_of == {"n1": "roce-leaf-09"}
