#!/bin/busybox sh
# /init of the rxe-vm initramfs (testbeds/src/rxevm/initramfs.rs packs it with static busybox and
# the guest kernel's modules). It loads the modules, mounts the host's root read-only and the lab
# read-write over virtio-9p, runs the lab's .rxe-vm/run.sh chrooted into the host's root, leaves
# the exit status in the lab and powers off. The host reads the console for the markers below.
/bin/busybox --install -s /bin
export PATH=/bin

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

fail() {
	echo "ROCEMESH-RXE-VM: init-failed $*"
	poweroff -f
	sleep 5
	exit 1
}

# The modules come numbered in dependency order. One that fails to load is reported and skipped:
# the command may not need it, and the console says which one it was.
read -r up0 _ </proc/uptime
for m in /modules/*.ko; do
	insmod "$m" || echo "rxe-vm-init: insmod $m failed"
done
read -r up1 _ </proc/uptime
echo "rxe-vm-init: /init started at ${up0} s, modules loaded at ${up1} s"

lab=
for arg in $(cat /proc/cmdline); do
	case "$arg" in
	rocemesh.lab=*) lab="${arg#rocemesh.lab=}" ;;
	esac
done
[ -n "$lab" ] || fail "no rocemesh.lab= on the kernel command line"

r=/newroot
# The root is read-only and nothing else changes it during a run: loose caching is safe and makes
# exec of the host's binaries much faster than uncached 9p.
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 hostroot $r ||
	fail "mounting the host's root (9p tag hostroot)"
mount -t proc proc $r/proc
mount -t sysfs sysfs $r/sys
mount -t devtmpfs devtmpfs $r/dev
mkdir -p $r/dev/pts $r/dev/shm
mount -t devpts devpts $r/dev/pts
mount -t tmpfs -o mode=1777 tmpfs $r/dev/shm
mount -t tmpfs -o mode=1777 tmpfs $r/tmp
mount -t tmpfs -o mode=0755 tmpfs $r/run
mount -t tmpfs -o mode=1777 tmpfs $r/var/tmp
mount -t cgroup2 cgroup2 $r/sys/fs/cgroup 2>/dev/null
mount -t debugfs debugfs $r/sys/kernel/debug 2>/dev/null
mount -t tracefs tracefs $r/sys/kernel/tracing 2>/dev/null
mount -t bpf bpf $r/sys/fs/bpf 2>/dev/null
# The lab path exists on the host's root; below /tmp, /run or /var/tmp it is created in the tmpfs.
mkdir -p "$r$lab" 2>/dev/null
# cache=mmap: the guest may write files through shared mappings, which uncached 9p refuses.
mount -t 9p -o trans=virtio,version=9p2000.L,cache=mmap,msize=512000 lab "$r$lab" ||
	fail "mounting the lab (9p tag lab) on $lab"
ip link set lo up
hostname rxe-vm

read -r up2 _ </proc/uptime
echo "rxe-vm-init: root mounted at ${up2} s"
echo
echo "ROCEMESH-RXE-VM: command-begin"
env -i /bin/chroot $r /bin/sh "$lab/.rxe-vm/run.sh" </dev/null
status=$?
echo "$status" >"$r$lab/.rxe-vm/status"
echo "ROCEMESH-RXE-VM: command-end $status"

# Whatever the command left running would keep the lab busy; then flush it to the host.
kill -9 -1 2>/dev/null
sleep 0.2
dmesg >"$r$lab/.rxe-vm/dmesg.log"
sync
umount "$r$lab" 2>/dev/null
poweroff -f
