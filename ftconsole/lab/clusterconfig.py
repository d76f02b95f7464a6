"""The lab's ftconsole cluster config (pure): generated from the layout and the nodes' ports, then checked."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from ftconsole.lab.files import LabPaths
from ftconsole.lab.layout import LabLayout
from ftconsole.lab.plan import LAB_HOST, NodeSpec
from ftconsole.scheduler.errors import LabError
from ftconsole.scheduler.spec import yamlfile
from ftconsole.scheduler.spec.config import ClusterConfig


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """`override` on top of `base`; mappings are merged key by key, anything else is replaced."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def render_cluster_config(
    layout: LabLayout, nodes: Sequence[tuple[NodeSpec, int]], paths: LabPaths, user: str
) -> dict[str, Any]:
    """The lab's cluster config: ssh settings and one entry per (node, port), merged with layout.cluster."""
    base: dict[str, Any] = {
        "state_dir": str(paths.state_dir),
        "ssh": {
            "user": user,
            "identity_file": str(paths.client_key),
            "known_hosts": str(paths.known_hosts),
            "config_file": None,
            "connect_timeout": "3s",
            "command_timeout": "20s",
        },
        "nodes": [{"name": spec.name, "host": LAB_HOST, "port": port, "pool": spec.pool} for spec, port in nodes],
        "pools": {group.pool: {} for group in layout.nodes},
        "admins": [user],
        # `ftconsole repair NODE` reboots a lab node through the lab, as an IPMI tool would power-cycle a real one
        "repair": {
            "reboot": [sys.executable, "-m", "ftconsole.lab", "fault", "--dir", str(paths.root), "{node}", "--reboot"]
        },
    }
    return deep_merge(base, layout.cluster)


def check_cluster_config(data: Mapping[str, Any], file: str) -> None:
    """Raise LabError when the generated config would not load (a layout's cluster settings at fault)."""
    try:
        cluster = ClusterConfig.model_validate(data)
    except ValidationError as exc:
        problems = yamlfile.problems_from_validation(exc, file, {})
        raise LabError("generated cluster config is invalid:\n" + "\n".join(map(str, problems))) from exc
    cross = cluster.cross_problems()
    if cross:
        raise LabError(
            "generated cluster config is invalid:\n" + "\n".join(f"{yamlfile.dotted(p)}: {m}" for p, m in cross)
        )
