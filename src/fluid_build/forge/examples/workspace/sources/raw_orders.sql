-- The orders as the shop's database exports them, one row per order.
create table raw.orders (
    order_id      varchar(36)  not null primary key,
    customer_id   varchar(36)  not null,
    ordered_at    timestamp    not null,
    sales_channel varchar(16)  not null,  -- web, store, marketplace
    currency      char(3)      not null
);
