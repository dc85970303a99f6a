#!/bin/busybox sh
# /sbin/modprobe of the rxe-vm initramfs. The kernel's request_module() runs it (from the
# initramfs, which kernel threads keep as their root) as `modprobe -q -- NAME` when tc asks for a
# qdisc, classifier or action that is not loaded. /lazy/map (written by
# testbeds/src/rxevm/initramfs.rs) has one line per name or alias: the name, then the modules to
# load, dependencies first.
bb=/bin/busybox
name=
for a in "$@"; do
	case "$a" in
	-*) ;;
	*) name="$a" ;;
	esac
done
[ -n "$name" ] || exit 1
line=$($bb grep -m1 "^$name " /lazy/map) || exit 1
status=0
for m in ${line#* }; do
	$bb grep -q "^$m " /proc/modules && continue
	# A concurrent request may have loaded it meanwhile: only a module still missing is a failure.
	$bb insmod "/lazy/$m.ko" 2>/dev/null || $bb grep -q "^$m " /proc/modules || status=1
done
exit $status
