"""A leader's write into a table protected by the fencing guard, from Python (psycopg 3).

Usage: DATABASE_URL=postgres://... python3 guarded_write.py
Sets up a protected table `py_orders` bound to lease `py-writer`, then shows the three things a
driver user must get right:

1. the term goes in with set_config('fencing.token', %s, true): a bind parameter cannot be used
   with SET LOCAL, and true makes it transaction-local like SET LOCAL;
2. the write and set_config must be in one transaction: in autocommit mode each statement is its
   own transaction, so the token is gone before the write and the guard refuses it;
3. a stale term is refused with SQLSTATE ZF409: catch it and stop acting as leader.

Prints one line per step and exits 0 when every step behaved as described.
"""

import os
import sys

import psycopg
from psycopg import sql

STALE = "ZF409"


def setup(conn):
    with conn.transaction():
        conn.execute("DROP TABLE IF EXISTS py_orders")
        conn.execute("CREATE TABLE py_orders (id int PRIMARY KEY, status text NOT NULL)")
        conn.execute("SELECT fencing.protect('py_orders', 'py_orders', NULL)")
        conn.execute("SELECT fencing.bind('py_orders', 'py-writer')")
        # Two leadership periods: an old leader's term and the current one's.
        old = conn.execute("SELECT term FROM fencing.acquire('py-writer', 'old', interval '1 ms')").fetchone()[0]
    conn.execute("SELECT pg_sleep(0.01)")
    with conn.transaction():
        new = conn.execute("SELECT term FROM fencing.acquire('py-writer', 'new', interval '60 s')").fetchone()[0]
    return old, new


def write(conn, term, order_id):
    """The pattern: one transaction, the token set inside it with set_config(..., true)."""
    with conn.transaction():
        conn.execute("SELECT set_config('fencing.token', %s, true)", (str(term),))
        conn.execute("INSERT INTO py_orders (id, status) VALUES (%s, 'new')", (order_id,))


def main():
    url = os.environ["DATABASE_URL"]
    with psycopg.connect(url, autocommit=True) as conn:
        old, new = setup(conn)
        print(f"terms: old leader {old}, current leader {new}")

        write(conn, new, 1)
        print(f"current leader's write with term {new}: committed")

        # The autocommit pitfall: set_config and the INSERT run as two transactions.
        conn.execute("SELECT set_config('fencing.token', %s, true)", (str(new),))
        try:
            conn.execute("INSERT INTO py_orders (id, status) VALUES (2, 'new')")
            print("autocommit pitfall: the write went through without a token (unexpected)")
            return 1
        except psycopg.Error as error:
            if error.sqlstate != STALE:
                raise
            print("autocommit pitfall: the token was gone before the INSERT; refused with ZF409")

        try:
            write(conn, old, 3)
            print("old leader's write: committed (unexpected)")
            return 1
        except psycopg.Error as error:
            if error.sqlstate != STALE:
                raise
            print(f"old leader's write with term {old}: refused with {error.sqlstate}: stop acting as leader")

        rows = conn.execute(sql.SQL("SELECT count(*) FROM py_orders")).fetchone()[0]
        print(f"rows in py_orders: {rows}")
        return 0 if rows == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
