"""Data flow over a kernel's PTX, for the compile tests."""
import re


def loads_behind_loaded_branches(ptx: str, until: str = "shfl.sync.bfly") -> list[tuple[str, str]]:
    """(branch, load) for every global load, from the kernel's entry to the first `until`, that comes after a
    conditional branch whose predicate derives from a value loaded from global memory (a forward taint over
    the PTX: ld.global's destinations, then every instruction with a tainted source): such a load is issued
    only once the value it waits behind has arrived."""
    body = ptx[ptx.index(".entry"):]
    tainted, branch, found = set(), None, []
    for line in body[body.index("{"):].splitlines():
        s = line.strip()
        if until in s:
            break
        if not s or s.startswith(("//", ".", "$", "{", "}")):
            continue
        guard = re.match(r"@!?(%\w+)\s+(.*)", s)
        pred, s = (guard.group(1), guard.group(2)) if guard else (None, s)
        op, _, rest = s.partition(" ")
        operands = rest.split(";")[0]
        if op.startswith("bra"):
            branch = branch or (line.strip() if pred in tainted else None)
            continue
        if op.startswith("ld.global") and branch:
            found.append((branch, line.strip()))
        regs = re.findall(r"%\w+", operands)
        n_dest = len(re.findall(r"%\w+", operands[:operands.index("}")])) if operands.lstrip().startswith("{") else 1
        if regs and (op.startswith("ld.global") or any(r in tainted for r in regs[n_dest:])):
            tainted.update(regs[:n_dest])
    return found
