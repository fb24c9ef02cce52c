#!/bin/sh
# make lint (clang-format with the committed style, cppcheck) is part of the test run.
echo 1..1
if out=$(make -s lint 2>&1); then
    echo "ok 1 - make lint is clean"
else
    echo "not ok 1 - make lint is clean"
    echo "$out" | sed 's/^/# /' | head -40
fi
