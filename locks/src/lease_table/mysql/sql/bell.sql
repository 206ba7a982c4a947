concat('fencelock:', md5(concat(database(), '/{table}/', {lock_name})))
