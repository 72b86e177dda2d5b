"""The table every compare script prints: a header, a rule, the rows, columns as wide as their
widest cell ("left" or "right" aligned)."""


def print_table(header, rows, align="left"):
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) for i in range(len(header))]
    pad = (lambda c, w: c.ljust(w)) if align == "left" else (lambda c, w: c.rjust(w))
    print(" | ".join(pad(h, w) for h, w in zip(header, widths)))
    print("-+-".join("-" * w for w in widths))
    for row in rows:
        print(" | ".join(pad(c, w) for c, w in zip(row, widths)))
