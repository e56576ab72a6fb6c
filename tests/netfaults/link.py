"""A network namespace joined to this one by a veth pair, and the faults the kernel can put on that link.

Triton runs in the namespace (`ip netns exec`), the facade outside it: their traffic crosses the veth pair and
nothing else, and no other process's traffic does. The kernel's packet filter inside the namespace (nftables, one
table of this module's) breaks the link on demand: random loss, connection resets (`reject with tcp reset`) and a
partition (every packet dropped, sockets left open). Each rule matches the namespace's end of the veth pair only.

What this kernel cannot do: added delay. tc's netem qdisc is not built (`Specified qdisc kind is unknown`) and no
module can be loaded, so delay is emulated above TCP by `tests.netfaults.proxy`. Everything here needs root,
iproute2 and nft (`unavailable()` says what is missing).
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
from types import TracebackType

TABLE = "tritonnx_faults"
# Private addresses for the pair, a /30 per namespace; the third octet is picked among those not in use here.
_SUBNETS = ipaddress.IPv4Network("10.213.0.0/16")


def _run(*command: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(command, input=stdin, capture_output=True, text=True, check=False)


def unavailable() -> str | None:
    """Why no namespace with faults can be made here (not root, no ip or nft), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [tool for tool in ("ip", "nft") if shutil.which(tool) is None]
    if missing:
        return f"no {' or '.join(missing)} (Debian: apt-get install iproute2 nftables)"
    return None


class LinkError(RuntimeError):
    """The namespace, the veth pair or a fault rule could not be set up."""


def _check(result: subprocess.CompletedProcess, what: str) -> None:
    if result.returncode != 0:
        raise LinkError(f"{what}: {(result.stderr or result.stdout).strip()}")


def _free_subnet() -> ipaddress.IPv4Network:
    used = _run("ip", "-o", "-4", "addr", "show").stdout
    for subnet in _SUBNETS.subnets(new_prefix=30):
        if f" {subnet.network_address + 1}/" not in used and f" {subnet.network_address + 2}/" not in used:
            return subnet
    raise LinkError(f"every /30 of {_SUBNETS} is in use")


def _remove_orphans() -> None:
    """Delete the namespaces of this module's naming whose process is gone (a run killed before it cleaned up)."""
    for line in _run("ip", "netns", "list").stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        pid = name.removeprefix("tritonnx-")
        if name.startswith("tritonnx-") and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            _run("ip", "netns", "delete", name)


class Link:
    """`ip netns add <name>`, a veth pair with `outer` (here) and `inner` (the namespace's) addresses; deleted on exit.

    `loss`, `reset` and `partition` replace whatever fault the link had; `clear` heals it.
    """

    def __init__(self, name: str = "") -> None:
        self.name = name or f"tritonnx-{os.getpid()}"
        self._veth_out = f"tnx{os.getpid() % 100000}o"  # interface names: 15 characters at most
        self._veth_in = f"tnx{os.getpid() % 100000}i"
        self.fault = "none"
        self.outer = self.inner = ""

    def __enter__(self) -> Link:
        _remove_orphans()
        _check(_run("ip", "netns", "add", self.name), f"ip netns add {self.name}")
        try:
            subnet = _free_subnet()
            self.outer, self.inner = str(subnet.network_address + 1), str(subnet.network_address + 2)
            steps = [
                ("ip", "link", "add", self._veth_out, "type", "veth", "peer", "name", self._veth_in),
                ("ip", "link", "set", self._veth_in, "netns", self.name),
                ("ip", "addr", "add", f"{self.outer}/30", "dev", self._veth_out),
                ("ip", "link", "set", self._veth_out, "up"),
                ("ip", "-n", self.name, "addr", "add", f"{self.inner}/30", "dev", self._veth_in),
                ("ip", "-n", self.name, "link", "set", self._veth_in, "up"),
                ("ip", "-n", self.name, "link", "set", "lo", "up"),
            ]
            for step in steps:
                _check(_run(*step), " ".join(step))
            self._rules()  # an empty table: proves nft works in the namespace before any test relies on it
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Delete the namespace (its end of the pair goes with it, and so does the other end)."""
        _run("ip", "netns", "delete", self.name)
        _run("ip", "link", "delete", self._veth_out)  # gone already, unless the namespace was never made

    def _rules(self, *rules: str) -> None:
        """Replace the fault table's rules with `rules` (each "input ..." or "output ..."), in one transaction."""
        script = [
            f"table inet {TABLE} {{}}",  # made if missing, so that the delete below always has a table
            f"delete table inet {TABLE}",
            f"table inet {TABLE} {{",
            "  chain input { type filter hook input priority 0; policy accept; }",
            "  chain output { type filter hook output priority 0; policy accept; }",
            "}",
            *(f"add rule inet {TABLE} {rule}" for rule in rules),
        ]
        _check(_run("ip", "netns", "exec", self.name, "nft", "-f", "-", stdin="\n".join(script) + "\n"), "nft")

    def loss(self, share: float) -> None:
        """Drop `share` of the packets crossing the link, either way, at random (TCP retransmits them)."""
        per_10k = round(share * 10_000)
        self._rules(
            f"input iifname {self._veth_in} numgen random mod 10000 < {per_10k} counter drop",
            f"output oifname {self._veth_in} numgen random mod 10000 < {per_10k} counter drop",
        )
        self.fault = f"loss {share:.0%}"

    def reset(self) -> None:
        """Answer every TCP segment from outside with a reset: open connections break, new ones are refused."""
        self._rules(f"input iifname {self._veth_in} meta l4proto tcp counter reject with tcp reset")
        self.fault = "reset"

    def partition(self) -> None:
        """Drop everything either way: no error reaches either side, connections stall until timeouts end them."""
        self._rules(f"input iifname {self._veth_in} counter drop", f"output oifname {self._veth_in} counter drop")
        self.fault = "partition"

    def packets(self) -> int:
        """Packets the fault's rules acted on (dropped or answered with a reset) since it was put on: proof it acted."""
        listing = _run("ip", "netns", "exec", self.name, "nft", "-j", "list", "table", "inet", TABLE)
        _check(listing, "nft list table")
        rules = (item["rule"] for item in json.loads(listing.stdout)["nftables"] if "rule" in item)
        return sum(part["counter"]["packets"] for rule in rules for part in rule["expr"] if "counter" in part)

    def clear(self) -> None:
        self._rules()
        self.fault = "none"
