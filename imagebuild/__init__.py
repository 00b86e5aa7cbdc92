"""`make image`'s builder and the two scripts the Dockerfile's build stage runs (pins.py,
detectron2_install.py). A host tool, like cluster/ and bench/: not part of the megdet package,
run from the repository root (``python -m imagebuild.build``); what runs in a pod is image/."""
