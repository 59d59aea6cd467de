"""Write the offline example cassette that `fluid forge` replays when no key is set.

    python tools/make_forge_cassette.py

Deterministic: rerunning reproduces the file byte for byte. The exchanges are
constructed in OpenAI's documented chat-completions shapes (success and the
429 rate-limit body of https://platform.openai.com/docs/guides/error-codes),
not recorded: this project has no key to record with.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OUT = (
    Path(__file__).resolve().parents[1]
    / "src/fluid_build/forge/examples/sales_orders.cassette.json"
)
PATH = "/v1/chat/completions"
MODEL = "gpt-4o-mini"

PLAN = {
    "tables": ["fct_order_lines", "dim_customer", "dim_product", "dim_date", "dim_sales_channel"],
    "steps": [
        "Stage raw orders and order lines; deduplicate on order_line_id.",
        "Build conformed dimensions with surrogate keys (customer, product, date, channel).",
        "Build fct_order_lines at one row per order line with revenue, quantity and discount.",
        "Add tests: unique order_line_id, not-null keys, revenue >= 0.",
    ],
    "notes": "Late-arriving order lines need a 3-day reprocessing window.",
}

COLUMNS = [
    {"name": "order_line_id", "type": "string", "description": "Primary key"},
    {"name": "order_id", "type": "string"},
    {"name": "customer_key", "type": "integer"},
    {"name": "product_key", "type": "integer"},
    {"name": "order_date", "type": "date"},
    {"name": "sales_channel", "type": "string"},
    {"name": "quantity", "type": "integer"},
    {"name": "revenue", "type": "decimal(18,2)"},
    {"name": "discount_amount", "type": "decimal(18,2)"},
]

CONTRACT = {
    "fluidVersion": "0.7",
    "kind": "DataProduct",
    "name": "sales_orders",
    "domain": "sales",
    "owner": "sales-data@example.com",
    "description": "Order lines with revenue and quantity, for daily sales reporting.",
    "grain": "one row per order line",
    "modeling": {
        "technique": "dimensional",
        "fact": "fct_order_lines",
        "dimensions": ["dim_customer", "dim_product", "dim_date", "dim_sales_channel"],
    },
    "schema": COLUMNS,
    "metrics": [
        {"name": "revenue", "expression": "sum(revenue)"},
        {"name": "quantity", "expression": "sum(quantity)"},
        {"name": "discount_amount", "expression": "sum(discount_amount)"},
    ],
    "quality": [
        {"rule": "unique", "column": "order_line_id"},
        {"rule": "not_null", "columns": ["order_line_id", "order_id", "order_date"]},
        {"rule": "expression", "check": "revenue >= 0"},
    ],
}

FILES = [
    {
        "path": "models/fct_order_lines.sql",
        "content": (
            "select\n    ol.order_line_id,\n    ol.order_id,\n    c.customer_key,\n"
            "    p.product_key,\n    cast(o.ordered_at as date) as order_date,\n"
            "    o.sales_channel,\n    ol.quantity,\n    ol.quantity * ol.unit_price as revenue,\n"
            "    ol.discount as discount_amount\nfrom {{ ref('stg_order_lines') }} ol\n"
            "join {{ ref('stg_orders') }} o using (order_id)\n"
            "join {{ ref('dim_customer') }} c using (customer_id)\n"
            "join {{ ref('dim_product') }} p using (product_id)\n"
        ),
    },
    {
        "path": "docs/sales_orders.md",
        "content": "# sales_orders\n\nOne row per order line. Revenue is quantity x unit price, "
        "before discount.\n",
    },
]

RATE_LIMIT_MESSAGE = (
    "Rate limit reached for gpt-4o-mini in organization org-offline on requests per min (RPM): "
    "Limit 3, Used 3, Requested 1. Please try again in 2s. Visit "
    "https://platform.openai.com/account/rate-limits to learn more."
)

RATIONALE = (
    "A star schema at the order-line grain keeps revenue additive across every dimension; "
    "discount is kept as its own measure so net revenue can be derived."
)


def completion(content: dict[str, Any], call: int, prompt: int, out: int) -> dict[str, Any]:
    return {
        "status": 200,
        "headers": {"content-type": "application/json", "x-request-id": f"req_offline_{call}"},
        "body": {
            "id": f"chatcmpl-offline-{call}",
            "object": "chat.completion",
            "created": 1767225600 + call,
            "model": "gpt-4o-mini-2024-07-18",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": json.dumps(content)},
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": out,
                "total_tokens": prompt + out,
            },
        },
        "body_text": None,
    }


def request() -> dict[str, Any]:
    return {"method": "POST", "path": PATH, "model": MODEL}


def main() -> None:
    broken = {**CONTRACT}
    del broken["grain"]
    cassette = {
        "version": 1,
        "name": "sales_orders-offline-forge",
        "description": "The offline `fluid forge` example: plan, a 429 with Retry-After: 2, a "
        "contract missing its grain (corrected on the next attempt), then a valid contract.",
        "provider": "openai",
        "model": MODEL,
        "source": "constructed from OpenAI's documented chat-completions and 429 shapes by "
        "tools/make_forge_cassette.py; not a recording",
        "call": {
            "kind": "complete",
            "messages": [
                {
                    "role": "user",
                    "content": "(the forge stages send the intent of "
                    "src/fluid_build/forge/examples/sales_orders.intent.yaml)",
                }
            ],
        },
        "exchanges": [
            {"request": request(), "response": completion(PLAN, 1, 212, 148)},
            {
                "request": request(),
                "response": {
                    "status": 429,
                    "headers": {
                        "content-type": "application/json",
                        "retry-after": "2",
                        "x-ratelimit-remaining-requests": "0",
                        "x-request-id": "req_offline_2",
                    },
                    "body": {
                        "error": {
                            "message": RATE_LIMIT_MESSAGE,
                            "type": "requests",
                            "param": None,
                            "code": "rate_limit_exceeded",
                        }
                    },
                    "body_text": None,
                },
            },
            {
                "request": request(),
                "response": completion(
                    {"contract": broken, "additional_files": FILES, "rationale": RATIONALE},
                    3,
                    540,
                    720,
                ),
            },
            {
                "request": request(),
                "response": completion(
                    {"contract": CONTRACT, "additional_files": FILES, "rationale": RATIONALE},
                    4,
                    1310,
                    735,
                ),
            },
        ],
        "expect": {"outcome": "success", "attempts": 4, "waits": [2.0]},
    }
    OUT.write_text(json.dumps(cassette, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
