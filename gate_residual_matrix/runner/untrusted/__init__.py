"""What comes from someone else: files read bounded and never blocking (:mod:`.files`), and
names shown to a user escaped (:mod:`.names`)."""
