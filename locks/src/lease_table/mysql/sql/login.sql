substring_index(user(), '@', 1)
