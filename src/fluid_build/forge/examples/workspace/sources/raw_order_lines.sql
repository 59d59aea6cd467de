-- The lines of each order: a product, a quantity, a unit price and a discount.
create table raw.order_lines (
    order_line_id varchar(36)    not null primary key,
    order_id      varchar(36)    not null references raw.orders (order_id),
    product_id    varchar(36)    not null,
    quantity      integer        not null check (quantity > 0),
    unit_price    numeric(18, 2) not null,
    discount      numeric(18, 2) not null default 0
);
