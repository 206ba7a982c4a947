select release_all_locks()
