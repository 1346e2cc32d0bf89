"""``tqbridge campaign SPEC [--out DIR] [--address ADDR] [--num-cpus N] [--serial]``.

Runs a campaign spec's matrix of tqbridge commands as Ray tasks (:mod:`tqbridge.parity.campaign`):
a local Ray by default, a cluster with ``--address``. Prints a line as each cell starts and finishes,
then the table; writes ``DIR/campaign.json`` and ``DIR/campaign.md`` as cells finish. A re-run with the
same ``--out`` skips finished cells. Exit code 0 when every cell passed, 1 otherwise.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from .cli import CliError


def add_arguments(p) -> None:
    p.add_argument("spec", help="the campaign spec (.toml, or .yaml with PyYAML): see docs/campaigns.md")
    p.add_argument("--out", default=None,
                   help="folder of the record (campaign.json, campaign.md); default: campaign-<spec name>")
    p.add_argument("--address", default=None,
                   help="a Ray cluster's address (host:port that `ray start --head` prints, or 'auto' for one "
                        "started on this machine); default: a local Ray for this run")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray (default: all)")
    p.add_argument("--serial", action="store_true",
                   help="no Ray: the cells one after another on this machine (no retries)")


def run(args) -> int:
    from tqbridge.parity.campaign import CampaignError, run_campaign

    if args.address and (args.serial or args.num_cpus is not None):
        raise CliError("--address runs on a cluster: --serial and --num-cpus apply to a local run")
    if args.num_cpus is not None and args.num_cpus < 1:
        raise CliError(f"--num-cpus must be at least 1, got {args.num_cpus}")
    out = Path(args.out) if args.out else Path(f"campaign-{Path(args.spec).stem}")
    command = "tqbridge " + " ".join(map(shlex.quote, sys.argv[1:]))

    def progress(event, cell, camp):
        n = camp.counts()
        finished = n["cells"] - n["pending"]
        head = f"[{finished}/{n['cells']}]"
        if event == "skip":
            print(f"{head} skip   {cell['command_line']} ({cell['status']} in the record)", file=sys.stderr)
        elif event == "start":
            again = f", attempt {cell['attempt']}" if cell.get("attempt", 1) > 1 else ""
            node = f" node {cell['node'][:8]}" if cell.get("node") else ""
            print(f"{head} start  {cell['command_line']} (on {cell.get('host')}{node} pid {cell.get('pid')}{again})",
                  file=sys.stderr)
        else:
            sec = f"{cell['seconds']:.1f} s" if cell.get("seconds") is not None else "-"
            line = f"{head} {cell['status']:<6} {cell['command_line']} ({sec}"
            if (cell.get("attempts") or 1) > 1:
                line += f", {cell['attempts']} attempts"
            line += f"; {n['pass']} pass, {n['fail']} fail, {n['error']} error, {n['pending']} to go)"
            print(line, file=sys.stderr)
            if cell["status"] == "error":
                print(f"       error: {cell.get('error')}", file=sys.stderr)
        sys.stderr.flush()

    try:
        camp = run_campaign(args.spec, out, address=args.address, num_cpus=args.num_cpus, serial=args.serial,
                            command=command, progress=progress)
    except CampaignError as e:
        raise CliError(str(e)) from None
    rec = camp.record()
    s = rec["summary"]
    print(f"tqbridge campaign {rec['name']}: {s['cells']} cells ({camp.skipped} finished before), "
          f"{s['pass']} pass, {s['fail']} fail, {s['error']} error; {rec['wall_seconds']:.1f} s on "
          f"{rec['ray'].get('nodes')} node(s)")
    for c in rec["cells"]:
        if c["status"] != "pass":
            print(f"  {c['status']:<6} {c['command_line']}" + (f"\n         {c['error']}" if c.get("error") else ""))
    print(f"  record       {camp.json_path}")
    print(f"  table        {camp.markdown_path}")
    return 0 if s["pass"] == s["cells"] else 1
