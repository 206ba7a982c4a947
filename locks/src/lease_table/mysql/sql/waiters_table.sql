create table if not exists {table}_waiters (
    name       varchar(255)    not null,
    ticket     bigint unsigned not null auto_increment,
    waiter     varchar(64)     not null,
    expires_at datetime(6)     not null,
    primary key (name, ticket),
    unique key (name, waiter),
    key (ticket)
) engine = InnoDB
