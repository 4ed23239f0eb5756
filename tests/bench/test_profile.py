"""bench.profile reads `perf script` as perf prints it: samples cut from a recording of an 8-node warm
round (stacks shortened), each put in its thread group and class."""

from __future__ import annotations

import re

from bench.profile import HZ, Threads, split, table

DAEMON, CLIENT = 493, 900
LIBTORRENT_SO = "/work/.venv/lib/python3.11/site-packages/libtorrent/__init__.cpython-311-x86_64-linux-gnu.so"

SOFTIRQ = (
    "\tffffffff81eb094e net_rx_action ([kernel.kallsyms])\n"
    "\tffffffff81369c4d handle_softirqs ([kernel.kallsyms])"
)
SWITCH = "context-switches/period=1,call-graph=no/:  ffffffff82248b73 schedule ([kernel.kallsyms])"

PERF_SCRIPT = f"""\
agent   493/574   cpu-clock/freq=299/: \n\
\tffffffff815cefe7 shmem_add_to_page_cache ([kernel.kallsyms])
\tffffffff816db3d9 do_pwritev ([kernel.kallsyms])
\tffffffff8223c951 do_syscall_64 ([kernel.kallsyms])
\t           fdff8 pwritev64 (/usr/lib/x86_64-linux-gnu/libc.so.6)
\t          5e3ea0 libtorrent::aux::readwrite_vec_impl<char const, libtorrent::aux::pread_storage::write(\
libtorrent::span<char const>)::{{lambda(long)#1}}> ({LIBTORRENT_SO})

agent   493/625   cpu-clock/freq=299/: \n\
{SOFTIRQ}
\tffffffff81369eae __irq_exit_rcu ([kernel.kallsyms])
\t          13e4a1 __libc_recv (/usr/lib/x86_64-linux-gnu/libc.so.6)

agent   493/625   cpu-clock/freq=299/: \n\
\tffffffff822382f7 clear_page_erms ([kernel.kallsyms])
\tffffffff81607bdf do_anonymous_page ([kernel.kallsyms])
\tffffffff82242576 exc_page_fault ([kernel.kallsyms])
\tffffffff81000c82 asm_exc_page_fault ([kernel.kallsyms])
\t          16db75 __memmove_avx512_unaligned_erms (/usr/lib/x86_64-linux-gnu/libc.so.6)

agent   493/625   cpu-clock/freq=299/: \n\
\t          d2f8ce [unknown] ({LIBTORRENT_SO})

fetch-file_0   493/700   cpu-clock/freq=299/: \n\
\t          29c2be [unknown] (/usr/lib/x86_64-linux-gnu/libcrypto.so.3)
\t          1a2b3c _PyEval_EvalFrameDefault (/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0)

agent   493/493   cpu-clock/freq=299/: \n\
\t          1a2b3c _PyEval_EvalFrameDefault (/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0)

agent   900/900   cpu-clock/freq=299/: \n\
\t          1a2b3c _PyEval_EvalFrameDefault (/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0)

pgrep  1200/1200  cpu-clock/freq=299/: \n\
\tffffffff816d955e ksys_read ([kernel.kallsyms])
\t           11d5e read (/usr/lib/x86_64-linux-gnu/libc.so.6)

swapper     0/0     cpu-clock/freq=299/: \n\
{SOFTIRQ}
\tffffffff8224215b pv_native_safe_halt ([kernel.kallsyms])

swapper     0/0     cpu-clock/freq=299/: \n\
\tffffffff8224215b pv_native_safe_halt ([kernel.kallsyms])
\tffffffff82243c75 default_idle ([kernel.kallsyms])

           agent   493/625   {SWITCH}
           agent   493/625   {SWITCH}
    fetch-file_0   493/700   {SWITCH}
          aria2c  1300/1300  {SWITCH}
           pgrep  1200/1200  {SWITCH}
"""


def threads() -> Threads:
    return Threads(daemons={DAEMON: "agent"}, clients={CLIENT})


def test_each_sample_lands_in_its_thread_group_and_class() -> None:
    s = split(PERF_SCRIPT.splitlines(), threads())
    assert dict(s.samples["libtorrent threads"]) == {
        "kernel from pwritev64": 1,
        "softirq": 1,
        "page fault in __memmove_avx512_unaligned_erms": 1,
        "user code in libtorrent": 1,
    }
    # A Python thread by its own name, and the main thread (named like the process) with them.
    assert dict(s.samples["agent, Python threads"]) == {
        "user code in libcrypto.so.3": 1,
        "user code in libpython3.11.so.1.0": 1,
    }
    assert dict(s.samples["agent fetch"]) == {"user code in libpython3.11.so.1.0": 1}
    assert set(s.samples) == {"libtorrent threads", "agent, Python threads", "agent fetch"}
    assert s.idle_softirq == 1
    assert dict(s.switches) == {"libtorrent threads": 2, "agent, Python threads": 1, "aria2c": 1}


def cells(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


def test_the_table_prints_cpu_seconds_per_gib() -> None:
    gib = 1 / HZ  # so that one sample reads 1.000 CPU-s per GiB
    lines = table(split(PERF_SCRIPT.splitlines(), threads()), gib)
    assert cells(lines[1]) == ["libtorrent threads", "agent, Python threads", "agent fetch"]
    rows = {cells(line)[0]: cells(line)[1:] for line in lines[2:-1]}
    assert rows["kernel from pwritev64"] == ["1.000", "0.000", "0.000"]
    assert rows["total"] == ["4.000", "2.000", "1.000"]
    assert rows["context switches per GiB"] == [str(2 * HZ), str(HZ), "0"]
    assert lines[-1].strip() == "softirq in the idle task: 1.000 CPU-s per GiB"
