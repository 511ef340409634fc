#!/usr/bin/env python3
"""Lists the other crates' types that kafka-lock's stable API mentions, and fails on any but
the deliberate ones.

Reads rustdoc's JSON output made with hidden items included (`cargo +nightly rustdoc --lib
--no-default-features -- -Z unstable-options --output-format json --document-hidden-items`),
walks every public item reachable from the crate root that is not `#[doc(hidden)]` (nor inside
a hidden module), and collects the types of crates other than std, core and alloc that their
signatures, fields, variants and trait impls name. Also fails when the crate root has a public
module hidden from the docs other than `internals`, the one door to the internals
(docs/design.md, "What reaches inside").

Usage: scripts/public_api_types.py target/doc/kafka_lock.json
"""

import collections
import json
import sys

# tokio is a deliberate public dependency: LockOptions::events takes its channel's sender.
ALLOWED = {"tokio"}
# The hidden public modules the root may have: the one door to the internals.
HIDDEN_DOORS = {"internals"}

def main(path):
    doc = json.load(open(path))
    index, paths, crates = doc["index"], doc["paths"], doc["external_crates"]
    seen = set()
    uses = collections.defaultdict(set)

    def hidden(item):
        return any("doc(hidden)" in json.dumps(a).replace(" ", "") for a in item.get("attrs", []))

    def refs(node, owner):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "resolved_path" and isinstance(value, dict):
                    p = paths.get(str(value.get("id")))
                    if p and p["crate_id"] != 0:
                        crate = crates[str(p["crate_id"])]["name"]
                        if crate not in ("std", "core", "alloc"):
                            uses[(crate, "::".join(p["path"]))].add(owner)
                refs(value, owner)
        elif isinstance(node, list):
            for value in node:
                refs(value, owner)

    def visit(item_id, name):
        key = str(item_id)
        if key in seen or key not in index:
            return
        seen.add(key)
        item = index[key]
        if hidden(item) or item.get("crate_id", 0) != 0 or item.get("visibility") not in ("public", "default"):
            return
        kind, body = next(iter(item["inner"].items()))
        here = f"{name}::{item.get('name') or ''}"
        if kind == "module":
            for child in body["items"]:
                visit(child, here)
            return
        if kind == "use":
            if body.get("id") is not None:
                visit(body["id"], name)
            return
        refs({k: v for k, v in body.items() if k not in ("impls", "items", "variants", "fields")}, here)
        for k in ("items", "variants", "fields"):
            for child in body.get(k) or []:
                visit(child, here)
        for impl_id in body.get("impls") or []:
            impl = index.get(str(impl_id))
            if not impl or hidden(impl):
                continue
            ib = impl["inner"]["impl"]
            if ib.get("is_synthetic") or ib.get("blanket_impl"):
                continue
            if ib.get("trait"):
                refs(ib["trait"], here + " (trait impl)")
            else:
                for child in ib["items"]:
                    visit(child, here)

    visit(doc["root"], "")
    if len(seen) < 20:
        sys.exit(f"only {len(seen)} items reached: has rustdoc's JSON format changed?")
    bad = False
    for (crate, type_path), owners in sorted(uses.items()):
        ok = crate in ALLOWED
        bad |= not ok
        print(f"{'ok ' if ok else 'BAD'} {type_path} in {', '.join(sorted(owners))}")
    print(f"{len(seen)} items reached")
    if bad:
        sys.exit("the stable API names types of other crates; hide the item or use a type of ours")
    doors = sorted(
        item.get("name") or ""
        for item in (index.get(str(i)) for i in index[str(doc["root"])]["inner"]["module"]["items"])
        if item and hidden(item) and item.get("visibility") == "public" and "module" in item["inner"]
    )
    print(f"hidden public modules at the root: {', '.join(doors) or 'none'}")
    if set(doors) - HIDDEN_DOORS:
        sys.exit("a hidden public module other than `internals`: make it private and name what "
                 "outside code needs in src/internals.rs")

if __name__ == "__main__":
    main(sys.argv[1])
