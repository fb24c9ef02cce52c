"""Minimal TAP for the Python tests: ok(), diag() and done() (the plan line and exit code)."""

count = 0
failed = 0


def ok(cond, name):
    global count, failed
    count += 1
    if not cond:
        failed += 1
    print(f"{'ok' if cond else 'not ok'} {count} - {name}", flush=True)
    return bool(cond)


def diag(msg):
    for line in str(msg).splitlines() or [""]:
        print(f"# {line}", flush=True)


def done():
    """Prints the plan; the exit code for sys.exit."""
    print(f"1..{count}", flush=True)
    return 1 if failed else 0
