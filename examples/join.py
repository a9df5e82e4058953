"""Revenue per customer: orders joined with customers on the customer id, summed per name.

Run it on a cluster with:

    funke submit examples/join.py
    funke submit examples/join.py --orders orders.csv --customers customers.csv --parallelism 4

Without --orders/--customers the job uses the small tables below, which travel inside the job
graph. CSV inputs need a header row with the columns of ORDERS_SCHEMA and CUSTOMERS_SCHEMA.
The result (name, revenue, orders) is collected and printed by the client.

Graph: the two sources feed one "Join" vertex (orders are its input 0, customers its input 1),
both hash-partitioned on customer_id; the join's output is hash-partitioned on name into
"Aggregate -> Sink: Collect".
"""

from __future__ import annotations

import argparse

from funke import ExecutionEnvironment, JobGraph

ORDERS_SCHEMA = "order_id bigint, customer_id bigint, amount double"
CUSTOMERS_SCHEMA = "customer_id bigint, name string"

# Amounts are floats on purpose: Spark does not accept a Python int for a double column.
ORDERS = [
    (1, 10, 25.0),
    (2, 11, 12.5),
    (3, 10, 7.25),
    (4, 12, 99.0),
    (5, 13, 3.5),
    (6, 11, 40.0),
    (7, 10, 18.75),
    (8, 14, 60.0),  # a customer we do not know: dropped by the inner join
    (9, 12, 1.0),
    (10, 13, 22.0),
]
CUSTOMERS = [
    (10, "Ada"),
    (11, "Grace"),
    (12, "Edsger"),
    (13, "Barbara"),
]


def build(args: list[str]) -> JobGraph:
    parser = argparse.ArgumentParser(prog="join", description="Sums order amounts per customer name.")
    parser.add_argument("--orders", help=f"CSV files of orders ({ORDERS_SCHEMA})")
    parser.add_argument("--customers", help=f"CSV files of customers ({CUSTOMERS_SCHEMA})")
    parser.add_argument("--parallelism", type=int, default=2, help="parallelism of every operator")
    opts = parser.parse_args(args)
    if (opts.orders is None) != (opts.customers is None):
        parser.error("give both --orders and --customers, or neither")

    env = ExecutionEnvironment("revenue per customer", job_type="batch", parallelism=opts.parallelism)
    if opts.orders:
        orders = env.read_csv(opts.orders, schema=ORDERS_SCHEMA)
        customers = env.read_csv(opts.customers, schema=CUSTOMERS_SCHEMA)
    else:
        orders = env.from_collection(ORDERS, schema=ORDERS_SCHEMA)
        customers = env.from_collection(CUSTOMERS, schema=CUSTOMERS_SCHEMA)
    orders.name("Source: orders").uid("orders")
    customers.name("Source: customers").uid("customers")

    (
        orders.join(customers, on="customer_id")
        .key_by("name")
        .aggregate("round(sum(amount), 2) as revenue", "count(*) as orders")
        .collect()
    )
    return env.build()
