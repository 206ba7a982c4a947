select get_lock(concat('fencelock:i:', md5(concat(database(), '/{table}'))), 60)
