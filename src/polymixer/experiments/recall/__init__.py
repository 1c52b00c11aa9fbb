"""The recall family's experiment: associative recall (MQAR, Zoology's recipe): the synthetic task, train, and the
recall bench."""
