"""The Chinese of the fixed phrases of what a student reads from the course (autograder.runtime.messages).

Each key is a phrase exactly as the code writes it (an f-string's literal text, each field `{}`; one line of
it); each value its Chinese, the same fields in the English order (`{}`), or reordered (`{0}`, `{1}`: the
inner fields). A field at the very start or end of a key is the text around the phrase: the value starts, or
ends, with `{}` there. Terms and style: zh/GLOSSARY.md (rank, all-reduce, shard, world size stay English).
tests/test_zh_messages.py checks that every key is still a phrase of autograder/runtime or autograder/checks.
"""

# -- autograder/runtime: the report, the runner, the ledger, comparisons ---------------------------------------

RUNTIME = {
    # report.py: a graded cell's verdict and pass line
    "{} · {}: FAILED": "{} · {}：未通过",
    "{} · {}: NOT DECIDED (not a verdict on your code)": "{} · {}：未判定（这不是对你的代码的判决）",
    "\u2713 {} \u00b7 {} \u2014 passed ({})": "\u2713 {} \u00b7 {} \u2014\u2014 通过（{}）",
    ", {} s of it starting the ranks": "，其中 {} s 用于启动各 rank",
    "{} is not done yet: {} is still the stub (it raises NotImplementedError). This test uses it: implement {} "
    "first, run its answer cell, then run this one again.":
        "{} 还没有完成：{} 仍是 stub（它抛出 NotImplementedError）。这个测试用到了它：先实现{}，运行它的答题 "
        "cell，再重新运行这个测试。",
    "{} is not done yet: {} is still the stub (it raises NotImplementedError). This cell uses it: implement {} "
    "first, run its answer cell, then run this one again.":
        "{} 还没有完成：{} 仍是 stub（它抛出 NotImplementedError）。这个 cell 用到了它：先实现{}，运行它的答题 "
        "cell，再重新运行这个 cell。",
    "{} is not done yet: {} is still the stub (it raises NotImplementedError). Implement it in the answer cell of "
    "{}, run that cell, then run this one again.":
        "{} 还没有完成：{} 仍是 stub（它抛出 NotImplementedError）。在{}的答题 cell 里实现它，运行那个 cell，"
        "再重新运行这个测试。",
    "{} is still the stub (it raises NotImplementedError): implement it in its answer cell, run that cell, then "
    "run this one again.":
        "{} 仍是 stub（它抛出 NotImplementedError）：在它的答题 cell 里实现它，运行那个 cell，再重新运行这个 cell。",
    "The cell that defines it failed: {}. Fix it, run it again, then run this test.":
        "定义它的 cell 出错了：{}。修好它，重新运行，再运行这个测试。",
    "{} is defined by the answer cell of {}: run that cell (and fix the error it shows, if any), then run this "
    "test again.":
        "{} 由{}的答题 cell 定义：运行那个 cell（它报错的话先修好），再重新运行这个测试。",
    "In your code (innermost last):": "你的代码（最内层在最后）：",
    "check parameters: ": "检查参数：",

    # compare.py: element-wise comparisons
    "{}: {} of {} elements differ; worst at index {}: expected {}, got {} (|diff| {}); tolerance for {}: rtol={}, "
    "atol={}.":
        "{}：{1} 个元素中有 {0} 个不同；相差最大的在下标 {2}：期望 {3}，实际 {4}（|diff| {5}）；{6} 的容差："
        "rtol={7}，atol={8}。",
    "{}: {} of {} elements differ (compared exactly); first at index {}: expected {}, got {}.":
        "{}：{1} 个元素中有 {0} 个不同（精确比较）；第一个在下标 {2}：期望 {3}，实际 {4}。",
    "{} is None; expected a tensor of shape {} ({}).": "{} 是 None；期望一个形状为 {}（{}）的张量。",
    "{}: expected a torch.Tensor, got {}.": "{}：期望 torch.Tensor，实际是 {}。",
    "{}: shape {}, expected {}.": "{}：形状是 {}，期望 {}。",
    "{}: dtype {}, expected {}.": "{}：dtype 是 {}，期望 {}。",
    "The numbers are wrong too: ": "数值也不对：",
    "Wrong: ": "不对：",
    "{}{}; the first in detail:": "{}{}；第一个的详情：",
    "({} more communication finding(s) on other ranks or ops)": "（其他 rank 或 op 上还有 {} 处通信问题）",
    "; and {} more": "；另有 {} 个",

    # ledger.py: communication expected and seen
    "    (no communication)": "    （没有通信）",
    "rank {}{}: expected {} {}, saw {}{}. Communication of rank {}:":
        "rank {}{}：期望 {} 次 {}，实际 {} 次{}。rank {} 的通信：",
    " ({} {} in {} with other shapes, dtypes or group sizes)": "（{2} 中另有 {0} 次 {1}，形状、dtype 或组大小不同）",
    "any phase": "任一阶段",
    "rank {}{}: expected no communication{}, saw {} op(s):": "rank {}{}：期望没有通信{}，实际有 {} 个 op：",
    "collective #{} on a group of {}{} differs between ranks: rank {} issued {}, rank {} issued {}. Ranks must call "
    "the same collectives with the same shapes in the same order (gloo may otherwise return wrong results without "
    "an error).":
        "大小为 {1} 的组上的集合通信 #{0}{2} 在各 rank 之间不一致：rank {3} 发起的是 {4}，rank {5} 发起的是 {6}。"
        "各 rank 必须按相同的顺序、以相同的形状调用相同的集合通信（否则 gloo 可能不报错却返回错误的结果）。",

    # agreement.py: the ranks of a group calling different collectives
    "{} was given a non-contiguous tensor (shape {}, strides {}), called at {}. gloo copies it quietly, NCCL "
    "refuses it (\"Tensors must be contiguous\") and an in-place result may not land in your view: pass "
    "`.contiguous()` (and copy the result back if you need it in the view).":
        "{} 收到了一个非连续的张量（形状 {}，strides {}），调用位置 {}。gloo 会悄悄复制它，NCCL 会拒绝它"
        "（\"Tensors must be contiguous\"），而且原地操作的结果可能落不到你的 view 里：传入 `.contiguous()`"
        "（如果 view 里需要结果，再把它复制回去）。",
    "collective #{} on the group of ranks {} differs between ranks:":
        "由 rank {1} 组成的组上的集合通信 #{0} 在各 rank 之间不一致：",
    "Every rank of a group must call the same collectives, with the same shapes and dtypes, in the same order (gloo "
    "may otherwise return wrong numbers or abort).":
        "一个组里的每个 rank 都必须按相同的顺序调用相同的集合通信，形状和 dtype 也要相同（否则 gloo 可能返回错误的"
        "数值，或者直接中止）。",
    "collective #{} on the group of ranks {}: not every rank called it:":
        "由 rank {1} 组成的组上的集合通信 #{0}：并非每个 rank 都调用了它：",
    "Every rank of a group must make the same collective calls: one rank skipped one (a collective inside an `if "
    "rank == ...`?), or made an extra one.":
        "一个组里的每个 rank 都必须发起相同的集合通信调用：有一个 rank 跳过了一次（集合通信写在了 `if rank == ...` "
        "里？），或者多调用了一次。",
    "  rank {}: returned from its rank program after {} collective(s) on this group":
        "  rank {}：在这个组上调用了 {} 次集合通信之后就从 rank 程序返回了",
    "(not called from your code)": "（不是从你的代码调用的）",
    "{}, called at {}": "{}，调用位置 {}",

    # dist.py: ranks that failed, crashed, deadlocked or ran out of budget
    "run_distributed: deadlock: every rank still running ({}) was waiting on its peers at the same place at two "
    "looks {} s apart, and none made progress in between (world size {}). Where each rank was waiting is below; "
    "every rank was stopped.":
        "run_distributed：死锁：所有仍在运行的 rank（{}）在相隔 {} s 的两次查看中都停在同一处等待对方，其间没有任何"
        "进展（world size {}）。下面是每个 rank 等待的位置；所有 rank 都已停止。",
    "run_distributed: inconclusive (world size {}): {}. The machine is too busy to tell a slow run from a hang: this "
    "is not a verdict on your code. Run it again when the machine is less loaded.":
        "run_distributed：无法判定（world size {}）：{}。机器太忙，分不清是运行得慢还是卡住了：这不是对你的代码的"
        "判决。等机器空闲一些再运行一次。",
    "the ranks did not all start within {} s (each rank's interpreter, `import torch`, the rendezvous; your code had "
    "not begun): rank(s) {} had not reached the rendezvous":
        "各 rank 没有在 {} s 内全部启动（每个 rank 的解释器、`import torch`、rendezvous；你的代码还没开始运行）："
        "rank {} 还没有到达 rendezvous",
    "after {} s the ranks {} had neither finished nor failed, nor used their budget of {} CPU-seconds each, nor "
    "shown a deadlock (every rank waiting on its peers, twice, with no progress)":
        "{} s 之后，rank {} 既没有结束也没有失败，没有用完各自 {} CPU 秒的预算，也没有显出死锁（每个 rank 都在等"
        "对方，两次查看之间毫无进展）",
    "; CPU-seconds used: {}": "；已用的 CPU 秒：{}",
    "run_distributed: rank(s) {} computed for {} CPU-seconds without finishing (the run's budget; a correct "
    "solution needs a small part of it, on a busy machine too: the budget counts CPU time, not the clock) (world "
    "size {}). An endless loop? Each rank's stack is below; every rank was stopped.":
        "run_distributed：rank {} 计算了 {} CPU 秒仍未结束（这是本次运行的预算；正确的实现只需要其中一小部分，在"
        "繁忙的机器上也是如此：预算计的是 CPU 时间，不是挂钟时间）（world size {}）。死循环？下面是每个 rank 的栈；"
        "所有 rank 都已停止。",
    "run_distributed: rank(s) {} failed (world size {}).": "run_distributed：rank {} 失败（world size {}）。",
    "rank {} raised an exception, and rank(s) {} the same one{}": "rank {} 抛出了异常，rank {} 抛出了同一个异常{}",
    " (`{}` is still a stub: implement it first)": "（`{}` 仍是 stub：先实现它）",
    "rank {} raised an exception": "rank {} 抛出了异常",
    "rank {} died: {}": "rank {} 崩溃了：{}",
    "rank {} did not finish (deadlocked, or out of CPU budget); its Python stack:":
        "rank {} 没有结束（死锁，或者用完了 CPU 预算）；它的 Python 栈：",
    "rank {} was still running when another rank failed; its Python stack:":
        "另一个 rank 失败时 rank {} 还在运行；它的 Python 栈：",
    "rank {} did not finish because another rank failed: {}.": "rank {} 没有结束，因为另一个 rank 失败了：{}。",
    "its connection to the failed rank was closed": "它与失败的那个 rank 之间的连接被关闭了",
    "ranks {}: each {}": "rank {}：各自{}",
    "had returned from its rank program and was waiting for the other ranks": "已从它的 rank 程序返回，正在等待其他 rank",
    "  rank {} output (last {} characters):": "  rank {} 的输出（最后 {} 个字符）：",
    "  in your code (innermost last):": "  你的代码（最内层在最后）：",
    "  raised at:": "  抛出位置：",
    "(no Python stack was written)": "（没有写出 Python 栈）",
    "Where each rank was when it was stopped:": "各 rank 被停止时所在的位置：",
    "was blocked in {} (torch.distributed), called from your code (outermost first):":
        "阻塞在 {}（torch.distributed）中，从你的代码调用（最外层在前）：",
    "was blocked in {} (torch.distributed), called at ": "阻塞在 {}（torch.distributed）中，调用位置：",
    "was in your code (outermost first):": "在你的代码中（最外层在前）：",
    "      ... {} more frame(s) of your code ...": "      ……你的代码还有 {} 层栈帧……",
    "exited with status {} without returning (os._exit or sys.exit in native code?)":
        "以状态 {} 退出，没有返回（os._exit，或者原生代码里的 sys.exit？）",
    "killed by {}{}": "被 {} 杀死{}",
    " (segmentation fault)": "（段错误）",
    "rank {}: the rank function returned a value that cannot be sent back to the caller ({}): {}. Return tensors, "
    "numbers, strings, and lists/dicts/dataclasses of them.":
        "rank {}：rank 函数返回的值无法送回调用方（{}）：{}。请返回张量、数字、字符串，以及由它们组成的 "
        "list/dict/dataclass。",
    "Sends and receives without a partner when the ranks stopped (global ranks; the k-th send from a to b pairs "
    "with b's k-th receive from a):":
        "各 rank 停止时还没有配对的 send 和 receive（全局 rank；a 到 b 的第 k 次 send 与 b 从 a 的第 k 次 receive "
        "配对）：",
    "The lines of your code that posted them (sends first):": "发出它们的代码行（send 在前）：",
    "rank {} never receives from rank {}": "rank {} 从不从 rank {} 接收",
    "rank {} posted only {} receive(s) from rank {}": "rank {} 只发出了 {} 次从 rank {} 的 receive",
    "rank {} never sends to rank {}": "rank {} 从不向 rank {} 发送",
    "rank {} posted only {} send(s) to rank {}": "rank {} 只发出了 {} 次到 rank {} 的 send",
    "send #{} to": "send #{} 发往",
    "sends #{}-#{} to": "sends #{}-#{} 发往",
    "receive #{} from": "receive #{} 来自",
    "receives #{}-#{} from": "receives #{}-#{} 来自",
    "  rank {}: {} rank {} ({}) at {}: {}": "  rank {}：{} rank {}（{}），位于 {}：{}",
    "  rank {} sends {} to rank {} (at {}), but rank {} receives {} from rank {} (at {})":
        "  rank {} 发送 {} 给 rank {}（位于 {}），但 rank {} 接收的是来自 rank {6} 的 {5}（位于 {7}）",
    "  rank {} sends to rank {}, which waits to receive from rank {} instead ({} on both sides): {} names the wrong "
    "peer":
        "  rank {} 发送给 rank {}，而后者在等待从 rank {} 接收（两边都是 {}）：{} 写错了对方",
    "the send (at {}) or the receive (at {})": "send（位于 {}）或 receive（位于 {}）",
    "the send or the receive (both at {})": "send 或 receive（都位于 {}）",
    "  ... and {} more": "  ……另有 {} 个",

    # gpu.py: the optional NCCL runs
    "skipped: {}": "跳过：{}",
    "passed on NCCL ({} s)": "在 NCCL 上通过（{} s）",
    "FAILED on NCCL: {}": "在 NCCL 上失败：{}",
    "no CUDA device on this machine (the checks above ran with gloo on CPU)":
        "这台机器没有 CUDA 设备（上面的检查是在 CPU 上用 gloo 运行的）",
    "this torch build has no NCCL backend": "这个 torch 版本没有 NCCL 后端",
    "this machine has {} CUDA device(s); these NCCL checks need {}": "这台机器有 {} 个 CUDA 设备；这些 NCCL 检查需要 {} 个",
    "{} CUDA device(s), NCCL available": "{} 个 CUDA 设备，NCCL 可用",
}

# -- autograder/checks: the checks' own phrases ------------------------------------------------------------------

CHECKS: dict[str, str] = {}

ZH = {**RUNTIME, **CHECKS}
