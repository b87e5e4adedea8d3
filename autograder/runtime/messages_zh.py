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
    "run_distributed: rank(s) {} stopped: for {} s none of them ran, made progress or waited for a CPU (the "
    "operating system's record: they were asleep, not slowed by a busy machine) (world size {}). A `time.sleep`, "
    "or a wait for something that never comes? Each rank's stack is below; every rank was stopped.":
        "run_distributed：rank {} 被停止了：{} s 内它们既没有运行、没有进展，也没有在等 CPU（这是操作系统的记录："
        "它们在睡眠，而不是被繁忙的机器拖慢）（world size {}）。是 `time.sleep`，还是在等一个永远等不到的结果？"
        "下面是每个 rank 的栈；所有 rank 都已停止。",
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

CHECKS: dict[str, str] = {
    # runtime: more of the runner and the ledger
    ' (called from {})':
        '（调用自 {}）',
    '(no stack was written)':
        '（没有写出栈）',
    'run_distributed: rank {} sent back something that is not plain data ({}). Rank programs return tensors, numbers, strings, and lists, tuples and dicts of them.':
        'run_distributed：rank {} 送回的不是普通数据（{}）。rank 程序应返回张量、数字、字符串，以及由它们组成的 list、tuple 和 dict。',
    'world_size must be a positive int, got {}':
        'world_size 必须是正整数，实际是 {}',
    'timeout must be positive, got {}':
        'timeout 必须是正数，实际是 {}',
    'run_distributed: fn must be callable, got {}':
        'run_distributed：fn 必须可调用，实际是 {}',
    # checks/__init__.py: argument errors
    'rank {}: {}: expected ValueError, nothing was raised.':
        'rank {}：{}：期望抛出 ValueError，实际什么也没有抛出。',
    'rank {}: {}: expected ValueError, got {}: {}':
        'rank {}：{}：期望 ValueError，实际是 {}：{}',
    'rank {}: {}: ValueError raised only after communicating; validate before {}:':
        'rank {}：{}：ValueError 是在通信之后才抛出的；请在 {} 之前就检查参数：',
    'rank {}: {}: the ValueError should name the sizes involved ({}); its message was: {}':
        'rank {}：{}：ValueError 应该指出相关的大小（{}）；它的消息是：{}',
    # checks/data_parallel/ddp_zero.py
    'rank {}: parameter {} is missing from the model after {}.':
        'rank {}：{2} 之后模型里没有参数 {1} 了。',
    'grad of {} (unused)':
        '{} 的 grad（未使用）',
    'rank {}: grad of {} should stay None (no rank produced one), got a tensor of shape {}.':
        'rank {}：{} 的 grad 应该保持 None（没有 rank 产生它），实际是一个形状为 {} 的张量。',
    'grad of {} after {}':
        '{} 的 grad，经过 {}',
    'grad of {} (a parameter no rank used) is None; after finish_gradient_synchronization() every trainable parameter must have a grad (zeros here).':
        '{} 的 grad（没有 rank 用到的参数）是 None；finish_gradient_synchronization() 之后每个可训练参数都必须有 grad（这里为零）。',
    '{} after the broadcast':
        'broadcast 之后的 {}',
    'a group of one communicates nothing':
        '组大小为 1 时不做任何通信',
    'expected buckets (cap {} bytes):':
        '期望的 bucket（上限 {} 字节）：',
    '    bucket {}: {} ({} elements, {} bytes, {})':
        '    bucket {}：{}（{} 个元素，{} 字节，{}）',
    'rank {}: BucketedDDP should only all-reduce after construction; saw:':
        'rank {}：BucketedDDP 在构造之后应该只做 all-reduce；实际看到：',
    'Communication of rank {}:':
        'rank {} 的通信：',
    'rank {}: expected {} all_reduce ({}: one per bucket, bucket order), saw {} ({}).':
        'rank {}：期望 {} 次 all_reduce（{}：每个 bucket 一次，按 bucket 顺序），实际 {} 次（{}）。',
    'rank {}: {} bucket all-reduce(s) were issued in phase {}, after backward; launch each bucket from the gradient hooks (and leftovers from an end-of-backward callback).':
        'rank {}：有 {} 次 bucket 的 all-reduce 是在 {} 阶段、反向之后发起的；请在梯度 hook 里发起每个 bucket（剩下的在反向结束时的回调里发起）。',
    'rank {}: bucket all-reduces must be asynchronous (async_op=True) so backward continues; {} were not.':
        'rank {}：bucket 的 all-reduce 必须是异步的（async_op=True），这样反向才能继续；有 {} 次不是。',
    'rank {}: bucket 0 ({}) was all-reduced only after backward had computed the gradient of layers.0.weight {}; launch a bucket as soon as its last gradient arrives, to overlap with backward.':
        'rank {}：bucket 0（{}）直到反向算完 layers.0.weight {} 的梯度之后才做 all-reduce；bucket 的最后一个梯度一到就应发起它，才能与反向 overlap。',
    'the first {} micro-steps, in no_sync()':
        'no_sync() 中的前 {} 个 micro-step',
    'the last micro-step, one per bucket':
        '最后一个 micro-step，每个 bucket 一次',
    'rank {}: the reduce-scatter has {} elements; the flat buffer of {} trainable elements must be padded to a multiple of the group size {}, with less than {} elements of padding.':
        'rank {}：reduce-scatter 有 {} 个元素；{} 个可训练元素的 flat buffer 必须补齐到组大小 {} 的整数倍，padding 少于 {} 个元素。',
    '{}; a group of one communicates nothing':
        '{}；组大小为 1 时不做任何通信',
    '{}, {} trainable elements padded to {}':
        '{}，{} 个可训练元素补齐到 {}',
    'forward and backward':
        '前向和反向',
    '; the all-gather mirrors the reduce-scatter':
        '；all-gather 是 reduce-scatter 的镜像',
    'rank {} ({}): unexpected communication {}:':
        'rank {}（{}）：意外的通信 {}：',
    ', parameter groups {} (name suffix, lr scale, weight decay)':
        '，参数组 {}（名字后缀、lr 倍数、weight decay）',
    "rank {} ({}): found no state tensors in optimizer.state (nor in an inner optimizer kept as an attribute); the optimizer's state for your range must be there.":
        'rank {}（{}）：在 optimizer.state 里（以及作为属性保存的内部优化器里）都没有找到状态张量；你的区间的优化器状态必须放在那里。',
    'rank {} ({}): optimizer state {} holds {} elements; the shard of this rank is {} elements ({} parameters padded to {}, over {} ranks). ZeRO keeps state for the owned range only.':
        'rank {}（{}）：优化器状态 {} 有 {} 个元素；本 rank 的 shard 是 {} 个元素（{} 个参数补齐到 {}，分给 {} 个 rank）。ZeRO 只为自己拥有的区间保存状态。',
    'rank {} ({}): optimizer state {} holds {} elements, but this rank updates {} elements of its range [{}, {}) that have gradients; each needs its own state.':
        'rank {0}（{1}）：优化器状态 {2} 有 {3} 个元素，但本 rank 要更新其区间 [{5}, {6}) 中 {4} 个有梯度的元素；每个都需要自己的状态。',
    'rank {} ({}): optimizer state {} has dtype {}, expected {} for {} parameters.':
        'rank {0}（{1}）：优化器状态 {2} 的 dtype 是 {3}，{5} 参数应为 {4}。',
    # checks/data_parallel/fsdp.py
    "rank {}: after fully_shard, module(s) {} have no parameter named 'flat_param' (this rank's shard of the unit's flat buffer).":
        "rank {}：fully_shard 之后，模块 {} 没有名为 'flat_param' 的参数（本 rank 在该单元 flat buffer 中的 shard）。",
    '{}, fully_shard per block then root, world size {}, reshard_after_forward={}{}, {}':
        '{}，先对每个 block 再对根模块调用 fully_shard，world size {}，reshard_after_forward={}{}，{}',
    'rank {}: expected one all-gather per fully_shard unit in forward ({}: {}), saw {}. Communication of rank {}:':
        'rank {}：前向中每个 fully_shard 单元应有一次 all-gather（{}：{}），实际 {} 次。rank {} 的通信：',
    'rank {}: the forward all-gather of unit {} has {} elements; its {} parameter elements must be padded to a multiple of the group size {}, with less than {} elements of padding (in order: root first, then the blocks). Communication of rank {}:':
        'rank {}：单元 {} 前向的 all-gather 有 {} 个元素；它的 {} 个参数元素必须补齐到组大小 {} 的整数倍，padding 少于 {} 个元素（顺序：先根模块，再各 block）。rank {} 的通信：',
    "rank {} ({}): in {} expected {}; saw {}. Per unit (padded sizes {}): forward 1 all-gather; backward {}1 reduce-scatter of the same size (the all-gather's mirror), in dtypes all-gather {}, reduce-scatter {}.":
        'rank {}（{}）：{} 中期望 {}；实际 {}。每个单元（补齐后的大小 {}）：前向 1 次 all-gather；反向 {}1 次同样大小的 reduce-scatter（all-gather 的镜像），dtype 分别是 all-gather {}、reduce-scatter {}。',
    '{}: output of step {}':
        '{}：第 {} 步的输出',
    'unit {}: flat_param shards of sizes {} on ranks 0..{}; every rank must hold an equal chunk.':
        '单元 {}：rank 0..{2} 上 flat_param shard 的大小是 {1}；每个 rank 必须持有同样大小的一块。',
    "{}: grad of unit {}'s flat_param (its chunk of [{}], padded to {}) after step 0":
        '{}：第 0 步之后单元 {} 的 flat_param 的 grad（它在 [{}] 中的那一块，补齐到 {}）',
    "{}: unit {}'s shards of all ranks, in rank order, after {} step(s) (flat order: {})":
        '{}：{1} 步之后所有 rank 上单元 {0} 的 shard，按 rank 顺序（flat 顺序：{2}）',
    "rank {} ({}): after fully_shard, {} of the original full parameters are still in memory. Keep only this rank's shard (no reference to the original parameters).":
        'rank {}（{}）：fully_shard 之后，原来的完整参数还有 {} 个留在内存里。只保留本 rank 的 shard（不要引用原来的参数）。',
    "rank {} ({}): at rest the model's parameters hold {} bytes; this rank's shards are {} bytes (padded unit sizes {} / {} x {} bytes). Each unit keeps one flat_param of padded/d elements, its own storage, and nothing else.":
        'rank {}（{}）：空闲时模型参数占用 {} 字节；本 rank 的 shard 是 {} 字节（补齐后的单元大小 {} / {} x {} 字节）。每个单元只保留一个 padded/d 个元素的 flat_param，有自己的 storage，别无其他。',
    'rank {} ({}): {}, {} gathered parameter buffer(s) of shape {} are still reachable (after gc.collect(), for {} s). ':
        'rank {}（{}）：{}，还有 {} 个 gather 出来的、形状为 {} 的参数 buffer 可以访问到（gc.collect() 之后，持续 {} s）。',
    "Free them after forward: drop every reference (autograd's saved tensors included: saved-tensor hooks) or resize their storage to 0, and gather again in backward.":
        '前向之后释放它们：丢掉所有引用（包括 autograd 保存的张量：用 saved-tensor hook），或者把它们的 storage resize 到 0，到反向时再 gather。',
    'Free the buffer gathered for backward once the reduce-scatter has run.':
        'reduce-scatter 执行之后，释放为反向 gather 的 buffer。',
    'rank {} ({}): parameters are all-gathered in param_dtype ({}) and gradients reduce-scattered in reduce_dtype ({}); {} collective(s) used another dtype:':
        'rank {}（{}）：参数应以 param_dtype（{}）做 all-gather，梯度应以 reduce_dtype（{}）做 reduce-scatter；有 {} 次集合通信用了别的 dtype：',
    "rank {} ({}): unit {}'s flat_param is {}; the sharded master weights stay float32 (only the gathered copy is {}).":
        'rank {}（{}）：单元 {} 的 flat_param 是 {}；切分后的 master weight 保持 float32（只有 gather 出来的副本是 {}）。',
    "rank {} ({}): unit {}'s flat_param.grad is {}; the gradient of a float32 master shard is float32.":
        'rank {}（{}）：单元 {} 的 flat_param.grad 是 {}；float32 master shard 的梯度是 float32。',
    'rank {} ({}): the output of step {} is {}; the model computes in param_dtype {} (cast the floating inputs, gather the parameters in it).':
        'rank {}（{}）：第 {} 步的输出是 {}；模型用 param_dtype {} 计算（把浮点输入转成它，参数也以它 gather）。',
    "{}: grad of unit {}'s flat_param after step 0":
        '{}：第 0 步之后单元 {} 的 flat_param 的 grad',
    "{}: unit {}'s shards after {} step(s)":
        '{}：{1} 步之后单元 {0} 的 shard',
    "rank {}: after fully_shard, module {} has no parameter named 'flat_param'.":
        "rank {}：fully_shard 之后，模块 {} 没有名为 'flat_param' 的参数。",
    'rank {}: gather_full_params returned {}, expected a dict {{name: tensor}}.':
        'rank {}：gather_full_params 返回了 {}，期望一个 dict {{name: tensor}}。',
    'rank {} ({}): gather_full_params should issue exactly one all-gather per unit ({}), saw:':
        'rank {}（{}）：gather_full_params 应该每个单元恰好发起一次 all-gather（{}），实际看到：',
    "rank {} ({}): gather_full_params keys differ from the unsharded model's state_dict(): missing {}, unexpected {}.":
        'rank {}（{}）：gather_full_params 的键与未切分模型的 state_dict() 不同：缺少 {}，多出 {}。',
    "rank {} ({}): gather_full_params changed the model's parameters {}; it must leave the shards as they are.":
        'rank {}（{}）：gather_full_params 改变了模型的参数 {}；它必须让各 shard 保持原样。',
    # checks/tensor_parallel/
    'check parameters: {} ({}) must be divisible by world_size ({})':
        '检查参数：{}（{}）必须能被 world_size（{}）整除',
    'rank {} ({}): expected {} {} of {}{} in {}, saw {}. Communication of rank {}:':
        'rank {}（{}）：{6} 中期望 {2} 次 {3}（{4}{5}），实际 {7}。rank {8} 的通信：',
    'rank {} ({}): unexpected communication in {} (expected only: {}); saw {} op(s). Communication of rank {}:':
        'rank {}（{}）：{} 中有意外的通信（期望只有：{}）；实际有 {} 个 op。rank {} 的通信：',
    'rank {}: {} returned {}, expected a tensor of shape {}':
        'rank {}：{} 返回了 {}，期望一个形状为 {} 的张量',
    'rank {}: {} returned shape {}, expected {}':
        'rank {}：{} 返回的形状是 {}，期望 {}',
    'rank {}: {} returned a tensor that does not require grad (the autograd graph was cut: detach(), .data or torch.no_grad()?)':
        'rank {}：{} 返回的张量不需要 grad（autograd 计算图被切断了：detach()、.data 还是 torch.no_grad()？）',
    'rank {}: {} has no attribute .{} (the shards live in .weight and .bias)':
        'rank {}：{} 没有属性 .{}（shard 放在 .weight 和 .bias 里）',
    '  (its .weight has shape {}; expected {})':
        '  （它的 .weight 形状是 {}；期望 {}）',
    'rank {}: {} forward failed on input {}: {}: {}':
        'rank {}：{} 在输入 {} 上前向失败：{}：{}',
    '{}: input gradient (backward)':
        '{}：输入梯度（反向）',
    '{}: forward output':
        '{}：前向输出',
    'rank {}: {} modified its input in place; it must return a new tensor (clone before an in-place collective)':
        'rank {}：{} 原地修改了它的输入；它必须返回一个新张量（在原地集合通信之前先 clone）',
    '{}; a group of size 1 communicates nothing':
        '{}；组大小为 1 时不做任何通信',
    "rank {}: {}: .weight has shape {}, expected {} (this rank's shard of the [out, in] master_weight)":
        'rank {}：{}：.weight 的形状是 {}，期望 {}（本 rank 在 [out, in] master_weight 中的 shard）',
    'rank {}: {}: .bias should be None with bias=False':
        'rank {}：{}：bias=False 时 .bias 应为 None',
    'slice of the full bias gradient':
        '完整 bias 梯度的切片',
    "partial: this rank's sequence chunk only, before allreduce_sequence_parallel_grads":
        '部分和（partial）：只有本 rank 的那段序列，在 allreduce_sequence_parallel_grads 之前',
    'the full bias gradient':
        '完整的 bias 梯度',
    'ColumnParallelLinear(4, 5) on 2 ranks: out_features not divisible':
        'ColumnParallelLinear(4, 5) 放在 2 个 rank 上：out_features 不能整除',
    'RowParallelLinear(5, 4) on 2 ranks: in_features not divisible':
        'RowParallelLinear(5, 4) 放在 2 个 rank 上：in_features 不能整除',
    'ColumnParallelLinear(6, 4) with a master_weight of shape [6, 4] (must be [out, in] = [4, 6])':
        'ColumnParallelLinear(6, 4)，master_weight 形状为 [6, 4]（必须是 [out, in] = [4, 6]）',
    'RowParallelLinear(4, 6) with a master_weight of shape [4, 6] (must be [out, in] = [6, 4])':
        'RowParallelLinear(4, 6)，master_weight 形状为 [4, 6]（必须是 [out, in] = [6, 4]）',
    'RowParallelLinear with tp_group=0 (a rank, not a ProcessGroup)':
        'RowParallelLinear，tp_group=0（这是一个 rank，不是 ProcessGroup）',
    'scatter_to_tensor_model_parallel_region on [4, 2, 5] (last dim 5) over 2 ranks':
        'scatter_to_tensor_model_parallel_region 作用于 [4, 2, 5]（最后一维为 5），2 个 rank',
    'reduce_scatter_to_sequence_parallel_region on [5, 2, 4] (dim 0 is 5) over 2 ranks':
        'reduce_scatter_to_sequence_parallel_region 作用于 [5, 2, 4]（dim 0 为 5），2 个 rank',
    'RowParallelLinear(4, 4, sequence_parallel=True) forward on a sequence of 5':
        'RowParallelLinear(4, 4, sequence_parallel=True) 在长度为 5 的序列上做前向',
    "rank {}: ParallelMLP must hold its layers as .linear_fc1 (column) and .linear_fc2 (row), as Megatron-LM's MLP does":
        'rank {}：ParallelMLP 必须像 Megatron-LM 的 MLP 那样，把它的层存为 .linear_fc1（column）和 .linear_fc2（row）',
    "rank {} ({}): ParallelMLP's parameters are {}; expected {} (a master bias of None means no bias, as nn.Linear(bias=False)).":
        'rank {}（{}）：ParallelMLP 的参数是 {}；期望 {}（master bias 为 None 表示没有 bias，与 nn.Linear(bias=False) 相同）。',
    ' (one marked parameter without a gradient)':
        '（一个没有梯度的标记参数）',
    'rank {} ({}): the marked parameter no forward used has a gradient after allreduce_sequence_parallel_grads; a parameter whose grad is None is skipped (it stays None).':
        'rank {}（{}）：没有被任何前向用到的标记参数在 allreduce_sequence_parallel_grads 之后有了梯度；grad 为 None 的参数应当跳过（保持 None）。',
    'rank {} ({}): expected no communication (nothing to sum), saw:':
        'rank {}（{}）：期望没有通信（没有要求和的东西），实际看到：',
    'rank {} ({}): expected all-reduces of {} elements in total (LayerNorm weight and bias, fc2 bias: 3 x {}) and nothing else; saw {} all-reduced elements:':
        'rank {}（{}）：期望 all-reduce 的元素一共 {} 个（LayerNorm 的 weight 和 bias，fc2 的 bias：3 x {}），别无其他；实际 all-reduce 了 {} 个元素：',
    'check parameters: need seq * batch >= world_size to put a target in every partition':
        '检查参数：需要 seq * batch >= world_size，才能在每个分区里都放一个 target',
    'vocab_parallel_cross_entropy, world size {}, [s, b, v] = [{}, {}, {}], {} logits{}':
        'vocab_parallel_cross_entropy，world size {}，[s, b, v] = [{}, {}, {}]，{} logits{}',
    '{}: gradient of the logits shard':
        '{}：logits shard 的梯度',
    "rank {} ({}): the input logits were modified in place; work on a copy (Megatron's in-place subtraction is not allowed here)":
        'rank {}（{}）：输入的 logits 被原地修改了；请在副本上计算（这里不允许 Megatron 那样的原地减法）',
    "check parameters: choose seq * batch != in_features so that only the weight gradient has the weight's shape":
        '检查参数：请选 seq * batch != in_features，这样只有权重梯度才有权重的形状',
    'LinearWithAsyncAllReduce, world size {}, input [{}, {}, {}], weight shard [{}, {}], bias={}, {}':
        'LinearWithAsyncAllReduce，world size {}，输入 [{}, {}, {}]，权重 shard [{}, {}]，bias={}，{}',
    'rank {} ({}): bias is None, yet a bias gradient came back':
        'rank {}（{}）：bias 为 None，却返回了 bias 的梯度',
    'Backward of rank {}, in order:':
        'rank {} 的反向，按顺序：',
    'rank {} ({}): the input-gradient all-reduce was synchronous; launch it with async_op=True so the weight gradient can be computed meanwhile.':
        'rank {}（{}）：输入梯度的 all-reduce 是同步的；用 async_op=True 发起它，这样权重梯度才能同时计算。',
    "rank {} ({}): no op in backward produced a tensor of the weight's shape {}: where is the weight gradient computed?":
        'rank {}（{}）：反向中没有任何 op 产生权重形状 {} 的张量：权重梯度是在哪里计算的？',
    'rank {} ({}): the all-reduce (#{}) was launched after the weight gradient ({}, #{}): nothing overlaps it.':
        'rank {}（{}）：all-reduce（#{}）是在权重梯度（{}，#{}）之后才发起的：没有任何计算与它 overlap。',
    'rank {} ({}): the async all-reduce was never waited for inside backward (call work.wait() before returning the input gradient).':
        'rank {}（{}）：异步 all-reduce 在反向里从没被等待（返回输入梯度之前调用 work.wait()）。',
    'rank {} ({}): wait() (#{}) came before the weight gradient ({}, #{}): the all-reduce was not overlapped with it (wait after computing the weight gradient).':
        'rank {}（{}）：wait()（#{}）出现在权重梯度（{}，#{}）之前：all-reduce 没有与它 overlap（应在算完权重梯度之后再等待）。',
    '{}: input gradient':
        '{}：输入梯度',
    '{}: input gradient (all-reduced)':
        '{}：输入梯度（all-reduce 后）',
    '{}: weight gradient':
        '{}：权重梯度',
    '{}: loss [s, b] (float32)':
        '{}：loss [s, b]（float32）',
    'unknown mapping {}; one of {}':
        '未知的 mapping {}；应为 {} 之一',
    # checks/pipeline_parallel/executor.py
    'Hint: the ranks deadlocked. With gloo a send completes only once the peer has posted the matching receive, so a send that blocks (dist.send, or isend(...).wait() straight away) waits for a peer that is itself blocked sending. Post sends (dist.isend) and return the handle, block only in receives, and wait each handle once, later (a second wait() on a gloo send never returns). Also check that every send goes to the neighbour that receives it: activations to the next rank, gradients to the previous one, as ranks of pp_group.':
        '提示：各 rank 死锁了。在 gloo 下，send 要等对方发起了匹配的 receive 才会完成，所以一个阻塞的 send（dist.send，或者紧接着 isend(...).wait()）会等待一个自己也阻塞在 send 上的对方。发起 send（dist.isend）并返回 handle，只在 receive 上阻塞，每个 handle 稍后等待一次（对 gloo 的 send 第二次 wait() 永远不会返回）。再检查每个 send 是否发给了接收它的那个邻居：激活发给下一个 rank，梯度发给上一个，都用 pp_group 中的 rank 表示。',
    "Hint: a receive buffer's size differs from what the peer sent (gloo aborts the process): recv_forward / recv_backward must allocate exactly the given shape and dtype, and the message must be the one the receiver expects (a micro-batch is [b, h] in the micro-batches' dtype).":
        '提示：接收 buffer 的大小与对方发送的不一致（gloo 会中止进程）：recv_forward / recv_backward 必须严格按给定的形状和 dtype 分配，而且消息必须是接收方期望的那一条（一个 micro-batch 是 [b, h]，dtype 与各 micro-batch 相同）。',
    'Hint: a rank sent to or received from itself (gloo has no connection to itself): the peer was computed wrongly. Peers are ranks of pp_group (pp_group.rank(), pp_group.size()), not global ranks; and with one stage there is nobody to talk to.':
        '提示：有 rank 在向自己发送或从自己接收（gloo 没有到自己的连接）：对方算错了。对方是 pp_group 中的 rank（pp_group.rank()、pp_group.size()），不是全局 rank；只有一个 stage 时没有任何人可以通信。',
    "Hint: a stage's input must be a leaf that requires grad, so that backward fills its .grad: a received tensor needs .requires_grad_(); with p = 1 and several chunks, hand chunk c's output to chunk c + 1 as output.detach().requires_grad_() (a send would have cut the graph there too).":
        '提示：stage 的输入必须是一个 requires grad 的叶子张量，这样反向才会填好它的 .grad：收到的张量需要调用 .requires_grad_()；p = 1 且有多个 chunk 时，把 chunk c 的输出以 output.detach().requires_grad_() 交给 chunk c + 1（一次 send 也会在那里切断计算图）。',
    'Hint: a peer is not a rank of pp_group. Use group ranks (pp_group.rank(), (rank + 1) % pp_group.size()) and pass them as group_dst= / group_src=; dst= / src= are global ranks.':
        '提示：有个对方不是 pp_group 中的 rank。请用组内 rank（pp_group.rank()、(rank + 1) % pp_group.size()），并作为 group_dst= / group_src= 传入；dst= / src= 是全局 rank。',
    'check parameters: pp_ranks {} must be disjoint lists of ranks < {}':
        '检查参数：pp_ranks {} 必须是互不相交的、由 < {} 的 rank 组成的列表',
    'check parameters: every pipeline group in {} must have the same size':
        '检查参数：{} 中的每个流水线组大小必须相同',
    "check parameters: hidden must be >= 2 (column 0 carries the micro-batch's tag)":
        '检查参数：hidden 必须 >= 2（第 0 列携带 micro-batch 的 tag）',
    'check parameters: pipeline groups {} do not have num_stages = {} ranks':
        '检查参数：流水线组 {} 的 rank 数不是 num_stages = {}',
    'run_pipeline is run here with the lists your {} returns, and they are not a schedule any executor could run; fix {} first (its own test says more). run_pipeline was not run.':
        '这里用你的 {} 返回的列表来运行 run_pipeline，而这些列表不是任何执行器能运行的调度；请先修好 {}（它自己的测试会说得更详细）。run_pipeline 没有运行。',
    'pipeline group {} of a world of {}':
        '流水线组 {}（world 大小为 {}）',
    'pipeline groups {} of a world of {}':
        '流水线组 {}（world 大小为 {}）',
    ', {} chunks per rank':
        '，每个 rank {} 个 chunk',
    " ('?': the stage got data that is no micro-batch's: a receive from the wrong peer, or a message received out of order)":
        '（“?”：stage 拿到的数据不属于任何 micro-batch：从错误的对方接收，或者消息收到的顺序不对）',
    '  schedule given to run_pipeline:':
        '  传给 run_pipeline 的调度：',
    'rank {} (group rank {}, {}): the stage ran {} as its action #{}, but its schedule says {}{}. Executed (recorded while it ran):':
        'rank {}（组内 rank {}，{}）：stage 把 {} 作为动作 #{} 执行，但它的调度写的是 {}{}。实际执行的（运行时记录）：',
    'rank {} ({}): a pipeline communicates only by P2P sends and receives; saw {} ({} collective op(s)). {}':
        'rank {}（{}）：流水线只通过 P2P 的 send 和 receive 通信；实际看到了 {}（{} 次集合通信）。{}',
    'rank {} ({}): one stage (p = 1) has no neighbour to talk to: expected no communication (a send to itself crashes gloo; pass tensors between its own chunks directly). {}':
        'rank {}（{}）：只有一个 stage（p = 1）时没有邻居可以通信：期望没有通信（向自己 send 会让 gloo 崩溃；在它自己的 chunk 之间直接传递张量）。{}',
    'rank {} (group rank {} of {}, {}): {}. Expected per step: {} (next = group rank {}, previous = group rank {}; activations go to the next rank, gradients to the previous). {}':
        'rank {}（组内 rank {}/{}，{}）：{}。每一步期望：{}（下一个 = 组内 rank {}，上一个 = 组内 rank {}；激活发给下一个 rank，梯度发给上一个）。{}',
    '{}: group rank {} sent {} tensor(s) forward to group rank {}, which sent {} gradient(s) back; each activation sent forward must come back as one gradient of the same shape and dtype (forward: send_forward, backward: send_backward).':
        '{}：组内 rank {} 向前发给组内 rank {2} {1} 个张量，而后者发回了 {3} 个梯度；每个向前发出的激活都必须以一个同形状、同 dtype 的梯度返回（前向：send_forward，反向：send_backward）。',
    'rank {} (group rank {}; {}): run_pipeline returned {}; only the last stage (group rank {}) returns the loss, the others None':
        'rank {}（组内 rank {}；{}）：run_pipeline 返回了 {}；只有最后一个 stage（组内 rank {}）返回 loss，其他的返回 None',
    'rank {} (group rank {}, the last stage; {})':
        'rank {}（组内 rank {}，最后一个 stage；{}）',
    '{}: run_pipeline returned {}; expected the mean loss as a Python float (e.g. with .item())':
        '{}：run_pipeline 返回了 {}；期望以 Python float 返回平均 loss（例如用 .item()）',
    ' ({} micro-batches: summed instead of averaged?)':
        '（{} 个 micro-batch：求了和而不是平均？）',
    '{}: loss {}, expected {}, the mean of the {} micro-batch losses; ratio {}{}':
        '{}：loss {}，期望 {}，即 {} 个 micro-batch loss 的平均；比值 {}{}',
    ' (chunk {} of group rank {})':
        '（组内 rank {1} 的 chunk {0}）',
    'rank {} (group rank {} of {}; {}): right after its forward #{} ({}) {} stage outputs were alive, but its schedule needs {} at that point (forwarded, not yet backwarded; at most {} for this stage). ':
        'rank {}（组内 rank {}/{}；{}）：刚做完前向 #{}（{}）时有 {} 个 stage 输出还活着，但此时它的调度只需要 {} 个（已前向、尚未反向；这个 stage 最多 {} 个）。',
    'Something keeps outputs alive after their backward: an entry never removed from a dict, a send handle kept (it keeps its tensor and graph alive), or a local variable still naming an earlier output. ':
        '有东西在反向之后还让输出活着：从没从 dict 中删除的条目，保留着的 send handle（它让它的张量和计算图活着），或者仍指向早先某个输出的局部变量。',
    'An output the schedule still needs for its backward was dropped or never kept. ':
        '调度反向时还需要的某个输出被丢掉了，或者从没保留。',
    'Alive after each forward: {}; needed: {}.':
        '每次前向之后活着的：{}；需要的：{}。',
    'rank {} ({}): the stage ran {} forwards; its schedule has {}':
        'rank {}（{}）：stage 执行了 {} 次前向；它的调度里有 {} 次',
    'rank {} (group rank {}; {}): {} stage output(s) still alive after run_pipeline returned: drop every output, input and send handle when the step ends (wait the handles first)':
        'rank {}（组内 rank {}；{}）：run_pipeline 返回之后还有 {} 个 stage 输出活着：一步结束时丢掉每个输出、输入和 send handle（先等待这些 handle）',
    'actions for micro-batch 3 of 3':
        '对 3 个 micro-batch 中的 micro-batch 3 的动作',
    'two chunks, actions without a chunk index':
        '两个 chunk，动作却没有 chunk 下标',
    'run_pipeline with {}: expected ValueError on every rank before any communication; instead the run failed:':
        'run_pipeline，{}：期望在任何通信之前每个 rank 都抛出 ValueError；运行却失败了：',
    'any send or receive':
        '任何 send 或 receive',
    'check parameters: the P2P helpers need a pipeline group of at least 2 ranks':
        '检查参数：P2P 辅助函数需要至少 2 个 rank 的流水线组',
    'rank {} ({}): {} returned {}; expected the handle of a posted send (what dist.isend returns), so the caller can wait it later':
        'rank {}（{}）：{} 返回了 {}；期望返回已发起的 send 的 handle（dist.isend 的返回值），好让调用者稍后等待它',
    'rank {} ({}): a send modified the tensor it was given':
        'rank {}（{}）：send 修改了传给它的张量',
    'rank {} (group rank {} of {}; {}): expected, in order, a send to group rank {}, a receive from {}, a send to {}, a receive from {}, each of {} {} (peers are ranks of pp_group: pp_group.rank(), not the global rank). Communication of rank {}:':
        'rank {}（组内 rank {}/{}；{}）：期望依次是：send 给组内 rank {}，从 {} receive，send 给 {}，从 {} receive，每次都是 {} {}（对方是 pp_group 中的 rank：pp_group.rank()，不是全局 rank）。rank {} 的通信：',
    'rank {} ({}): {} returned {}; expected a tensor':
        'rank {}（{}）：{} 返回了 {}；期望一个张量',
    'rank {} ({}): {} returned {} {}; expected {} {}':
        'rank {}（{}）：{} 返回了 {} {}；期望 {} {}',
    'data that no rank sent':
        '没有任何 rank 发送过的数据',
    "rank {} (group rank {} of {}; {}): {} returned {}; expected group rank {}'s {}":
        'rank {}（组内 rank {}/{}；{}）：{} 返回了 {}；期望组内 rank {} 的{}',
    'activation (the previous stage)':
        '激活（上一个 stage）',
    'gradient (the next stage)':
        '梯度（下一个 stage）',
    # checks/pipeline_parallel/schedules.py
    "{} returned {}; expected a list of actions like ('F', 0) and ('B', 0)":
        "{} 返回了 {}；期望一个动作列表，例如 ('F', 0) 和 ('B', 0)",
    '{}: action {} is {}; every action must be a tuple {} with kind {} and int indices':
        '{}：动作 {} 是 {}；每个动作都必须是 tuple {}，kind 为 {}，下标为 int',
    ", or a pair ('F&B', forward, backward)":
        "，或者一对 ('F&B', forward, backward)",
    '{}: action {} ({}) is outside {} micro-batches{}.':
        '{}：动作 {}（{}）超出了 {} 个 micro-batch{} 的范围。',
    '{}: {} is {} before its {}.':
        '{}：{0} 在它的 {2} 之前就 {1} 了。',
    '{}: {} is {} twice.':
        '{}：{} 被 {} 了两次。',
    '{}: {} actions, expected {} (one forward and one backward per micro-batch{}); never completed: {}.':
        '{}：{} 个动作，期望 {} 个（每个 micro-batch 一次前向和一次反向{}）；从未完成的：{}。',
    'groups of p micro-batches, each group through chunk 0, 1, ..., v-1':
        '每 p 个 micro-batch 一组，每组依次经过 chunk 0, 1, ..., v-1',
    'micro-batch order (FIFO: the oldest micro-batch first)':
        'micro-batch 的顺序（FIFO：最早的 micro-batch 在前）',
    'the forward groups, each through the chunks in reverse (v-1, ..., 0), micro-batches FIFO':
        '与前向相同的分组，每组倒序经过各 chunk（v-1, ..., 0），micro-batch 按 FIFO',
    '{}: {} #{} is {}, expected {}: {}s run in {}.':
        '{}：{} #{} 是 {}，期望 {}：{} 按 {} 运行。',
    '{}: {} forward(s) before the first backward; expected {}.':
        '{}：第一次反向之前有 {} 次前向；期望 {}。',
    '{}: two {} in a row at actions {} and {} ({}, {}) while forwards remain: after the warm-up the steady state alternates one backward and one forward, then only backwards remain (cool-down).':
        '{}：还有前向没做时，在动作 {1} 和 {2}（{3}，{4}）连续出现了两次 {0}：warm-up 之后的稳定阶段一次反向、一次前向交替，最后只剩反向（cool-down）。',
    'F{} of stage {} (rank {})':
        'stage {1} 的 F{0}（rank {2}）',
    'B{} of stage {} (rank {})':
        'stage {1} 的 B{0}（rank {2}）',
    'stage {}: blocked at action {} ({}), waiting for {}':
        'stage {}：阻塞在动作 {}（{}），等待 {}',
    'show_schedules: {} must be a positive int, got {}':
        'show_schedules：{} 必须是正整数，实际是 {}',
    "show_schedules: style must be 'loop' or 'v', got {}":
        "show_schedules：style 必须是 'loop' 或 'v'，实际是 {}",
    'run together, these schedules DEADLOCK:':
        '一起运行时，这些调度会死锁（DEADLOCK）：',
    'ideal timeline ({}, no communication time): idle fraction {}':
        '理想时间线（{}，不计通信时间）：空闲比例 {}',
    '{}: runs must be a list of ({}), got {}':
        '{}：runs 必须是由 ({}) 组成的列表，实际是 {}',
    '{}: runs is empty: give at least one ({})':
        '{}：runs 是空的：至少给一个 ({})',
    'is not a tuple':
        '不是 tuple',
    '{}: runs[{}] = {} {}; each run is ({})':
        '{}：runs[{}] = {} {}；每个 run 是 ({})',
    '{}: runs[{}]: {} must be a positive int, got {}':
        '{}：runs[{}]：{} 必须是正整数，实际是 {}',
    '{} with {} stages and {} micro-batches{}: run together, the stages deadlock (a stage blocks in a receive that its neighbour only sends after waiting for this stage):':
        '{}，{} 个 stage，{} 个 micro-batch{}：一起运行时各 stage 会死锁（一个 stage 阻塞在 receive 上，而它的邻居要等这个 stage 之后才会 send）：',
    '{}: the ValueError should name the sizes involved ({}); its message was: {}':
        '{}：ValueError 应该指出相关的大小（{}）；它的消息是：{}',
    '{}: expected ValueError, nothing was raised.':
        '{}：期望抛出 ValueError，实际什么也没有抛出。',
    'stage 2 of a 2-stage pipeline':
        '2 个 stage 的流水线的 stage 2',
    'all {} forwards first (GPipe), then the backwards':
        '先做全部 {} 次前向（GPipe），再做反向',
    'min(p - stage, m) = {}: a warm-up of min(p - stage - 1, m) = {} forward(s), then the first steady-state forward':
        'min(p - stage, m) = {}：warm-up 做 min(p - stage - 1, m) = {} 次前向，然后是稳定阶段的第一次前向',
    'all {} (the warm-up min(p - stage - 1, m) = {} covers every micro-batch)':
        '全部 {} 次（warm-up min(p - stage - 1, m) = {} 覆盖了每个 micro-batch）',
    '{}: a warm-up of min((p - stage - 1) * 2 + (v - 1) * p, m v) = {} forward(s){}':
        '{}：warm-up 做 min((p - stage - 1) * 2 + (v - 1) * p, m v) = {} 次前向{}',
    ', then the first steady-state forward':
        '，然后是稳定阶段的第一次前向',
    'bubble_fraction({}, {}, num_chunks={}) = {}; expected (p - 1) / (v m + p - 1) = {} / {} = {} (the idle share of the whole step, not of the busy time: (p - 1) / (v m) = {})':
        'bubble_fraction({}, {}, num_chunks={}) = {}；期望 (p - 1) / (v m + p - 1) = {} / {} = {}（空闲时间占整个一步的比例，而不是占忙碌时间的比例：(p - 1) / (v m) = {}）',
    # checks/pipeline_parallel/split_backward.py and zero_bubble.py
    ' (two chunks per rank)':
        '（每个 rank 两个 chunk）',
    'two linear layers with bias, a middle stage':
        '两个带 bias 的 linear 层，中间的 stage',
    'linear layers without bias, a middle stage':
        '不带 bias 的 linear 层，中间的 stage',
    'the first stage (its input is data: no input gradient)':
        '第一个 stage（它的输入是数据：没有输入梯度）',
    'the last stage (its output is the loss)':
        '最后一个 stage（它的输出是 loss）',
    'three layers and a layer norm, a middle stage':
        '三层加一个 layer norm，中间的 stage',
    'layer {} (linear {}->{}) weight':
        '第 {} 层（linear {}->{}）的 weight',
    'layer {} (linear) bias':
        '第 {} 层（linear）的 bias',
    'layer {} (layer norm) bias':
        '第 {} 层（layer norm）的 bias',
    'layer {} (layer norm) weight':
        '第 {} 层（layer norm）的 weight',
    '{}: backward_input changed the .grad of {} ({} parameter(s) in all): B computes the input gradient only; the weight gradients wait for backward_weight (W)':
        '{}：backward_input 改变了 {} 的 .grad（一共 {} 个参数）：B 只计算输入梯度；权重梯度要等 backward_weight（W）',
    "{}: backward_input set the input's .grad; it returns the input gradients instead (torch.autograd.grad, not .backward()), and changes no .grad":
        '{}：backward_input 设置了输入的 .grad；它应当返回输入梯度（用 torch.autograd.grad，而不是 .backward()），不改变任何 .grad',
    '{}: backward_input returned input_grads {} ({}); expected a list of {} tensor(s), one per input passed in':
        '{}：backward_input 返回的 input_grads 是 {}（{}）；期望一个含 {} 个张量的列表，每个传入的输入一个',
    '{}: gradient of the stage input returned by backward_input':
        '{}：backward_input 返回的 stage 输入的梯度',
    '{}: after backward_weight, {} has no .grad: W must accumulate every weight gradient its B left':
        '{}：backward_weight 之后 {} 没有 .grad：W 必须累加它的 B 留下的每个权重梯度',
    "{}: {}: .grad holds the earlier value plus TWICE this micro-batch's gradient: W accumulated it twice":
        '{}：{}：.grad 是原来的值加上这个 micro-batch 梯度的两倍（TWICE）：W 把它累加了两次',
    "{}: {}: .grad holds this micro-batch's gradient only; the earlier value was overwritten: W adds to .grad (as a full backward accumulates), it does not assign it":
        '{}：{}：.grad 只有这个 micro-batch 的梯度；原来的值被覆盖了：W 是加到 .grad 上（与完整的反向一样累加），而不是给它赋值',
    "{}: {}: .grad is TWICE the full backward's gradient: W accumulated it twice":
        '{}：{}：.grad 是完整反向梯度的两倍（TWICE）：W 把它累加了两次',
    'B computed (some of) the weight gradients ahead of W':
        'B 抢在 W 之前计算了（部分）权重梯度',
    'W computed more than the weight gradients (a second pass through the layers above each weight: run W from the saved gradients at the weights, not from the output)':
        'W 计算的不只是权重梯度（又经过了每个权重上方的各层一次：W 应从保存在权重处的梯度出发，而不是从输出出发）',
    "B computed more than one full backward's input-gradient work":
        'B 计算的输入梯度工作量超过了一次完整反向',
    '{}: FLOPs (torch.utils.flop_counter) of backward_input {} and backward_weight {}; expected {} and {} (one full backward: {}, of which the weight-gradient GEMMs 2 b in out per linear layer: {})':
        '{}：backward_input 的 FLOPs（torch.utils.flop_counter）为 {}，backward_weight 为 {}；期望 {} 和 {}（一次完整反向：{}，其中权重梯度的 GEMM 每个 linear 层 2 b in out：{}）',
    "{}: after backward_input returned and the caller dropped the stage output and its gradient, the output is still alive: B's state (or something else) keeps it and the graph above the last weight. W needs only what each weighted operation saved and the gradient arriving there (torch's stage_backward_input keeps the same)":
        '{}：backward_input 返回、调用者丢掉 stage 的输出和它的梯度之后，输出还活着：B 的 state（或者别的什么）保留着它以及最后一个权重上方的计算图。W 只需要每个带权重的操作保存的东西，以及到达那里的梯度（torch 的 stage_backward_input 保留的也是这些）',
    "{}: after backward_weight and its state dropped, {} of the stage's {} layer outputs are still alive: something still holds the step's graph or saved tensors (W uses its state up; keep no reference elsewhere)":
        '{}：backward_weight 执行、它的 state 被丢掉之后，stage 的 {1} 个层输出中还有 {0} 个活着：还有东西持有这一步的计算图或保存的张量（W 会用完它的 state；别在其他地方保留引用）',
    "{}{}: action #{} is {}, expected {} (the order torch's {} runs).":
        '{}{}：动作 #{} 是 {}，期望 {}（torch 的 {} 运行的顺序）。',
    "{}: ZB-H1 has no overlapped pairs (that is DualPipe's idea)":
        '{}：ZB-H1 没有 overlap 的动作对（那是 DualPipe 的思路）',
    '{}: micro-batch {} has no W: in ZB-H1 every backward is split into B (input gradient) and a W later.':
        '{}：micro-batch {} 没有 W：ZB-H1 中每个反向都拆成 B（输入梯度）和稍后的一个 W。',
    '{} with {} stages and {} micro-batches: run together, the stages deadlock:':
        '{}，{} 个 stage，{} 个 micro-batch：一起运行时各 stage 会死锁：',
    "{}({}, {}, {}): stage {} holds up to {} micro-batches' activations at once (forwarded, W not yet run); 1F1B's busiest stage holds min(p, m) = {}, and ZB-H1 must not hold more: a W deferred too long keeps its micro-batch's activations.":
        '{}({}, {}, {})：stage {} 同时持有最多 {} 个 micro-batch 的激活（已前向，W 尚未运行）；1F1B 最忙的 stage 持有 min(p, m) = {} 个，ZB-H1 不能比它多：推迟太久的 W 会一直占着它那个 micro-batch 的激活。',
    " (1F1B's bubble: the Ws do not fill it; stage s defers its W by s backwards)":
        '（这是 1F1B 的 bubble：W 没有填进去；stage s 应把它的 W 推迟 s 个反向）',
    '{} with p = {}, m = {}, costs F = {}, B = {} (of which W = {}): on the ideal timeline rank {} idles {}, expected (p - 1)(F + B - 2W) = {}{}. Idle per rank: {}':
        '{}，p = {}，m = {}，代价 F = {}，B = {}（其中 W = {}）：在理想时间线上 rank {} 空闲 {}，期望 (p - 1)(F + B - 2W) = {}{}。每个 rank 的空闲：{}',
    "ScheduleInterleavedZeroBubble (one stage per rank: ZB-H1) runs: 1F1B, each B's W run right after the backward s steps later":
        'ScheduleInterleavedZeroBubble（每个 rank 一个 stage：ZB-H1）的运行方式：1F1B，每个 B 的 W 紧跟在 s 步之后的那个反向后面运行',
    '{} with {} ranks (a V of {} stages) and {} micro-batches: run together, the stages deadlock:':
        '{}，{} 个 rank（{} 个 stage 组成的 V），{} 个 micro-batch：一起运行时各 stage 会死锁：',
    '3 micro-batches for a V of 4 stages':
        '4 个 stage 的 V 只有 3 个 micro-batch',
    '7 micro-batches for a V of 8 stages':
        '8 个 stage 的 V 只有 7 个 micro-batch',
    'run together, the stages deadlock:':
        '一起运行时各 stage 会死锁：',
    'run_pipeline_zb is run here with the lists your {} returns, and they are not a schedule any executor could run; fix {} first (its own test says more). run_pipeline_zb was not run.':
        '这里用你的 {} 返回的列表来运行 run_pipeline_zb，而这些列表不是任何执行器能运行的调度；请先修好 {}（它自己的测试会说得更详细）。run_pipeline_zb 没有运行。',
    " ('?': the stage got data that is no micro-batch's: a receive from the wrong peer or with the wrong tag, or a message received out of order)":
        '（“?”：stage 拿到的数据不属于任何 micro-batch：从错误的对方接收或 tag 不对，或者消息收到的顺序不对）',
    ' (a weight gradient computed when the schedule did not ask for one: a B whose W comes later must compute the input gradient only)':
        '（调度没有要求时计算了权重梯度：后面还有 W 的 B 只能计算输入梯度）',
    ' (the weight gradient was not computed here: a W skipped, or a B that did not compute it)':
        '（这里没有计算权重梯度：跳过了一个 W，或者某个 B 没有计算它）',
    '  expected from the list given to run_pipeline_zb:':
        '  按传给 run_pipeline_zb 的列表期望的：',
    'rank {} (group rank {}, {}): the stage ran {} as its computation #{}, but its schedule says {}{}. Executed (recorded while it ran; a whole backward shows as B then W):':
        'rank {}（组内 rank {}，{}）：stage 把 {} 作为计算 #{} 执行，但它的调度写的是 {}{}。实际执行的（运行时记录；完整的反向显示为 B 然后 W）：',
    "rank {} (group rank {} of {}, {}): {}. Expected per step: {} (this rank holds {}; stage k's activation goes to the rank of stage k + 1, its input gradient to the rank of stage k - 1; neighbouring stages on one rank hand tensors over without a message). {}":
        'rank {}（组内 rank {}/{}，{}）：{}。每一步期望：{}（本 rank 持有 {}；stage k 的激活发给 stage k + 1 所在的 rank，它的输入梯度发给 stage k - 1 所在的 rank；同一个 rank 上相邻的 stage 直接交接张量，不发消息）。{}',
    'rank {} (group rank {}; {}): run_pipeline_zb returned {}; only the rank holding the last stage (group rank {}) returns the loss, the others None':
        'rank {}（组内 rank {}；{}）：run_pipeline_zb 返回了 {}；只有持有最后一个 stage 的 rank（组内 rank {}）返回 loss，其他的返回 None',
    'rank {} (group rank {}, which holds the last stage; {})':
        'rank {}（组内 rank {}，持有最后一个 stage；{}）',
    '{}: run_pipeline_zb returned {}; expected the mean loss as a Python float':
        '{}：run_pipeline_zb 返回了 {}；期望以 Python float 返回平均 loss',
    'rank {}, {}: the weight has no gradient: a W never run (or a B that computed no weight gradient and had no W)':
        'rank {}，{}：这个权重没有梯度：有个 W 从没运行（或者某个 B 没有计算权重梯度，而它也没有 W）',
    "rank {}, {}: the weight gradient is TWICE single-process training's: the weight gradient was accumulated twice":
        'rank {}，{}：权重梯度是单进程训练的两倍（TWICE）：权重梯度被累加了两次',
    '{} stage outputs were alive, but its schedule needs {} (forwarded, B not yet run)':
        '有 {} 个 stage 输出活着，但它的调度只需要 {} 个（已前向，B 尚未运行）',
    "Something keeps outputs alive after their B: a dict entry never removed, a send handle kept, a local still naming an output, or a W state that holds the output (B's state needs only what the weight gradient needs). ":
        '有东西在 B 之后还让输出活着：从没删除的 dict 条目，保留着的 send handle，仍指向某个输出的局部变量，或者持有输出的 W state（B 的 state 只需要权重梯度需要的东西）。',
    'An output its B still needs was dropped. ':
        '它的 B 还需要的某个输出被丢掉了。',
    '{} stage inputs kept for a weight gradient were alive, but its schedule needs {} (forwarded, W not yet run)':
        '为权重梯度保留的 stage 输入有 {} 个活着，但它的调度只需要 {} 个（已前向，W 尚未运行）',
    "Something keeps a micro-batch's saved tensors after its W (or its whole B): the W state not dropped, a reference kept elsewhere. ":
        '有东西在某个 micro-batch 的 W（或它的完整 B）之后还保留着它保存的张量：W state 没有丢掉，或者别处还有引用。',
    'What a later W needs was dropped or never kept. ':
        '后面某个 W 需要的东西被丢掉了，或者从没保留。',
    "{} stage input(s) it received (activations from the previous stage) were alive, but its schedule needs at most {} (forwarded, W not yet run: the stage's graph keeps an input until the W that reads it, and nothing needs it after)":
        '收到的 stage 输入（上一个 stage 的激活）有 {} 个活着，但它的调度最多只需要 {} 个（已前向，W 尚未运行：stage 的计算图保留一个输入，直到读它的那个 W，之后就没有谁需要它了）',
    "Something keeps a micro-batch's input after its W (or its whole B): a dict entry read instead of removed, a list of inputs, a local still naming one. ":
        '有东西在某个 micro-batch 的 W（或它的完整 B）之后还保留着它的输入：只读取而没有删除的 dict 条目，一个输入列表，或者仍指向某个输入的局部变量。',
    "{} output gradient(s) of the stage's weighted layers (what backward_input leaves for W: the W state) were alive, but its schedule needs at most {} (Bs whose W has not run yet)":
        '该 stage 中带权重的层的输出梯度（backward_input 留给 W 的数据：W state）有 {} 个活着，但它的调度最多只需要 {} 个（W 尚未运行的 B）',
    'Something keeps a W state after its W: the state left in its dict (W run on a copy, or read instead of removed), a list of states, a reference kept elsewhere. ':
        '有东西在 W 之后还保留着它的 W state：state 留在了 dict 里（W 在副本上运行，或者只读取而没有删除），一个 state 列表，或者别处还有引用。',
    'rank {} (group rank {} of {}; {}): right after its forward #{} ({}) {}. {}{}':
        'rank {}（组内 rank {}/{}；{}）：刚做完前向 #{}（{}）时{}。{}{}',
    'Alive after each forward (outputs, W inputs, stage inputs, W-state gradients): {}; needed (the last two at most): {}.':
        '每次前向之后活着的（输出，W 的输入，stage 输入，W state 的梯度）：{}；需要的（后两项是上限）：{}。',
    'rank {} (group rank {}; {}): after run_pipeline_zb returned, {} stage output(s), {} input(s) kept for a weight gradient, {} received stage input(s) and {} W-state gradient(s) are still alive: drop every output, input, W state and send handle before the step ends':
        'rank {}（组内 rank {}；{}）：run_pipeline_zb 返回之后，还有 {} 个 stage 输出、{} 个为权重梯度保留的输入、{} 个收到的 stage 输入和 {} 个 W state 的梯度活着：一步结束之前丢掉每个输出、输入、W state 和 send handle',
    "plot_zb_timelines: runs[{}]: style must be 'loop' or 'v', got {}":
        "plot_zb_timelines：runs[{}]：style 必须是 'loop' 或 'v'，实际是 {}",
    # checks/context_parallel/
    '{}: {} has NaN (first at index {}). NaN comes from exp overflowing (inf / inf: subtract the max before exp) or from a row that sees no key (exp(-inf - (-inf)), 0 / 0: such a row must give out = 0 and lse = -inf).':
        '{}：{} 里有 NaN（第一个在下标 {}）。NaN 来自 exp 溢出（inf / inf：exp 之前先减去最大值），或者来自看不到任何 key 的行（exp(-inf - (-inf))，0 / 0：这样的行必须得到 out = 0、lse = -inf）。',
    ' It looks transposed: lse is [b, s, n_heads] in this course (the layout of q without head_dim); flash-attn and SDPA use [b, n_heads, s].':
        '看起来是转置了：本课程中 lse 是 [b, s, n_heads]（q 去掉 head_dim 后的布局）；flash-attn 和 SDPA 用的是 [b, n_heads, s]。',
    '{}{} returned {}; expected a pair (out, lse) of tensors':
        '{}{} 返回了 {}；期望一对张量 (out, lse)',
    '{}{}: out has shape {}, expected {}':
        '{}{}：out 的形状是 {}，期望 {}',
    '{}{}: lse has shape {}, expected {} [b, s, n_heads].{}':
        '{}{}：lse 的形状是 {}，期望 {} [b, s, n_heads]。{}',
    'check parameters: no query is fully masked; choose k_offset > q_offset':
        '检查参数：没有任何 query 被完全 mask；请选 k_offset > q_offset',
    ' (queries {} see no key)':
        '（query {} 看不到任何 key）',
    '{}: out does not require grad (the autograd graph was cut: detach(), .data or torch.no_grad()?); Ulysses back-propagates through it':
        '{}：out 不需要 grad（autograd 计算图被切断了：detach()、.data 还是 torch.no_grad()？）；Ulysses 要通过它做反向传播',
    'merge_attention over key blocks {} merged in the order {}, q {}, {}':
        'merge_attention，key 块 {}，按 {} 的顺序合并，q {}，{}',
    'check parameters: the largest lse is {}; raise logit_scale':
        '检查参数：最大的 lse 是 {}；请调大 logit_scale',
    'merge_attention of two key blocks, float64 logits with lse up to {} (> 709: exp(lse) overflows), merged in the order {}':
        '两个 key 块的 merge_attention，float64 logits，lse 最大到 {}（> 709：exp(lse) 会溢出），按 {} 的顺序合并',
    'merge_attention of causal key blocks [0, 3), [3, 6), [6, 9) for queries at positions 0..5 (rows with no visible key: lse = -inf), starting from the empty state (out 0, lse -inf), merged in the order {}':
        '位置 0..5 上的 query 对 causal key 块 [0, 3)、[3, 6)、[6, 9) 的 merge_attention（看不到任何 key 的行：lse = -inf），从空状态（out 0，lse -inf）开始，按 {} 的顺序合并',
    'merge_attention of two blocks whose every row is fully masked':
        '两个每一行都被完全 mask 的块的 merge_attention',
    'rank {} ({}): unexpected collective(s) in {}: ring attention moves K/V (and dK/dV) by P2P only (batch_isend_irecv). Communication of rank {} in {}:':
        'rank {}（{}）：{} 中有意外的集合通信：ring attention 只用 P2P（batch_isend_irecv）传递 K/V（以及 dK/dV）。rank {} 在 {} 中的通信：',
    'rank {} ({}): expected {} {}(s) in {}, saw {}. Communication of rank {} in {}:':
        'rank {}（{}）：{4} 中期望 {2} 次 {3}，实际 {5} 次。rank {6} 在 {7} 中的通信：',
    'from the previous rank':
        '从上一个 rank 来',
    'to the next rank':
        '发往下一个 rank',
    'rank {} ({}): a {} with group rank {} in {}; blocks travel {}, group rank {} = ({} {} 1) mod {}. (Peers are ranks of the CP group: group_peer=, not global ranks.)':
        'rank {}（{}）：与组内 rank {3} 的一次 {2}（{4}）；块应{5}，即组内 rank {6} = ({7} {8} 1) mod {9}。（对方是 CP 组中的 rank：group_peer=，不是全局 rank。）',
    'rank {} ({}): a {} of {} {} in {}; expected blocks of {} {} (K and V sent as separate tensors).':
        'rank {}（{}）：{5} 中有一次 {3} {4} 的 {2}；期望 {6} {7} 的块（K 和 V 作为两个张量分别发送）。',
    'check parameters: world_size ({}) must be a multiple of cp_size ({})':
        '检查参数：world_size（{}）必须是 cp_size（{}）的整数倍',
    '{}: the ranks did not finish. In a ring every receive needs a matching send: each rank sends to (rank + 1) % w and receives from (rank - 1) % w (group ranks), posted together (batch_isend_irecv) and waited after. A blocking dist.send, or a receive from the wrong side, hangs at w >= 3 (at w = 2 both neighbours are the same rank).':
        '{}：各 rank 没有结束。环上每个 receive 都需要一个匹配的 send：每个 rank 发给 (rank + 1) % w，从 (rank - 1) % w 接收（组内 rank），两者一起发起（batch_isend_irecv），之后再等待。阻塞的 dist.send，或者从错误的一侧接收，在 w >= 3 时会卡住（w = 2 时两个邻居是同一个 rank）。',
    'rank {}: {} returned an out that does not require grad (the autograd Function was bypassed?)':
        'rank {}：{} 返回的 out 不需要 grad（绕过了 autograd Function？）',
    'check parameters: seq ({}) must be divisible by {} for the {} layout':
        '检查参数：{} 布局要求 seq（{}）能被 {} 整除',
    ', CP groups {} of a world of {}':
        '，CP 组 {}（world 大小为 {}）',
    '{}(q, k, v{}) on {} shards, CP size {}{}, [b, s, n, d] = [{}, {}, {}, {}], {}':
        '{}(q, k, v{})，{} shard，CP 大小 {}{}，[b, s, n, d] = [{}, {}, {}, {}]，{}',
    '{}, group rank {} (positions {})':
        '{}，组内 rank {}（位置 {}）',
    '{}: forward sends K and V, 2(w - 1) = {} sends':
        '{}：前向发送 K 和 V，2(w - 1) = {} 次 send',
    '{}: backward sends K/V again, 2(w - 1) = {}, and the dK/dV accumulators home, 2w = {} (a full turn) or 2(w - 1) = {}':
        '{}：反向再发送一次 K/V，2(w - 1) = {} 次，并把 dK/dV 累加器送回家，2w = {} 次（整整一圈）或 2(w - 1) = {} 次',
    "rank {}: {}, group rank {}: {} FLOPs in {}, more than (r + 1) / w = {}/{} of the last group rank's {}. With the causal mask the queries of group rank {} see only the keys of group ranks 0..{}: the K/V blocks of later ranks are fully masked, skip them instead of computing them (FlopCounterMode counts a masked block as full work). FLOPs per group rank in {}: {}.":
        'rank {}：{}，组内 rank {}：{4} 中 {3} FLOPs，超过了最后一个组内 rank 的 {7} 的 (r + 1) / w = {5}/{6}。有 causal mask 时，组内 rank {8} 的 query 只能看到组内 rank 0..{9} 的 key：后面各 rank 的 K/V 块被完全 mask，应当跳过，而不是计算它们（FlopCounterMode 把被 mask 的块也算作完整的工作量）。{10} 中每个组内 rank 的 FLOPs：{11}。',
    'Forward of rank {}, in order (compute ops with FLOPs only):':
        'rank {} 的前向，按顺序（只列出有 FLOPs 的计算 op）：',
    'rank {} ({}): no matmul was traced in forward: compute attention with explicit matmuls (torch.matmul / einsum in attention_with_lse).':
        'rank {}（{}）：前向中没有记录到任何 matmul：请用显式的 matmul 计算 attention（在 attention_with_lse 中用 torch.matmul / einsum）。',
    'rank {} ({}): expected {} ring transfers in forward (one batch of posts per step but the last: send K and V to the next rank, receive the next K and V, with no attention and no wait between them), saw {} batch(es) of sends/receives.':
        'rank {}（{}）：前向中期望 {} 次环上传输（除最后一步外每步一批发起：把 K 和 V 发给下一个 rank，接收下一块 K 和 V，中间没有 attention 也没有等待），实际 {} 批 send/receive。',
    'rank {} ({}): transfer {} was never waited for (call .wait() on every work handle before using the received blocks).':
        'rank {}（{}）：传输 {} 从没被等待（使用收到的块之前，对每个 work handle 调用 .wait()）。',
    'rank {} ({}): nothing was computed while transfer {} was in flight (between its posts, #{}-#{}, and the next wait, #{}). Post the next transfer first, then compute the block you hold, then wait.':
        'rank {}（{}）：传输 {} 进行中（从它的发起 #{}-#{} 到下一次等待 #{} 之间）没有做任何计算。先发起下一次传输，再计算手上的块，然后等待。',
    'attention_block_backward(q {}, keys {}..{}, causal={}, q_offset=0, k_offset={}) with the final out and lse, {}':
        'attention_block_backward(q {}, keys {}..{}, causal={}, q_offset=0, k_offset={})，用最终的 out 和 lse，{}',
    '{}: dk (keys {}..{} of the full k.grad)':
        '{}：dk（完整 k.grad 的 key {}..{}）',
    '{}: dv (keys {}..{} of the full v.grad)':
        '{}：dv（完整 v.grad 的 key {}..{}）',
    '{}: dq has shape {}, expected {}':
        '{}：dq 的形状是 {}，期望 {}',
    "the sum of the blocks' dq over key blocks {} (the full q.grad)":
        'key 块 {} 上各块 dq 的和（完整的 q.grad）',
    '{} returned {}; expected a tuple (dq, dk, dv) of tensors':
        '{} 返回了 {}；期望一个由张量组成的 tuple (dq, dk, dv)',
    '{} returned {}, expected a tensor of shape {}':
        '{} 返回了 {}，期望一个形状为 {} 的张量',
    '{}: the shard holds positions {}, expected {} (chunks {} and {} of {}, in that order)':
        '{}：shard 持有的位置是 {0}，期望 {1}（{4} 块中的第 {2} 块和第 {3} 块，按这个顺序）',
    '{}: expected ValueError (length {} is not divisible by 2w = {}), nothing was raised':
        '{}：期望 ValueError（长度 {} 不能被 2w = {} 整除），实际什么也没有抛出',
    '{}: expected ValueError (length {} is not divisible by 2w = {}), got {}: {}':
        '{}：期望 ValueError（长度 {} 不能被 2w = {} 整除），实际是 {}：{}',
    '{}: the ValueError should name the sequence length ({}) and 2 * cp_size ({}); its message was {}':
        '{}：ValueError 应该指出序列长度（{}）和 2 * cp_size（{}）；它的消息是 {}',
    'check parameters: seq ({}) must be divisible by 2 * world_size ({})':
        '检查参数：seq（{}）必须能被 2 * world_size（{}）整除',
    'causal ring attention, contiguous and zigzag, world size {}':
        'causal ring attention，连续布局和 zigzag，world size {}',
    'FLOPs per rank in {} (FlopCounterMode): contiguous {}, zigzag {}':
        '{} 中每个 rank 的 FLOPs（FlopCounterMode）：连续布局 {}，zigzag {}',
    '{}, {}: rank(s) {} counted no FLOPs in {}. FlopCounterMode counts matmuls (mm, bmm); F.scaled_dot_product_attention counts 0 on CPU: compute attention with explicit matmuls. {}':
        '{}，{}：rank {} 在 {} 中没有计到任何 FLOPs。FlopCounterMode 计的是 matmul（mm、bmm）；F.scaled_dot_product_attention 在 CPU 上计为 0：请用显式的 matmul 计算 attention。{}',
    'zigzag_ring_attention, {}: unequal work in {}: rank {} does {} FLOPs, rank {} {}. {}':
        'zigzag_ring_attention，{}：{} 中工作量不均：rank {} 做了 {} FLOPs，rank {} 做了 {}。{}',
    "zigzag_ring_attention, {}: its busiest rank ({} FLOPs in {}) is not below the contiguous layout's ({}): skip the fully masked blocks and compute only the visible half of the others. {}":
        'zigzag_ring_attention，{}：它最忙的 rank（{2} 中 {1} FLOPs）并不比连续布局的（{3}）少：跳过完全被 mask 的块，其他块只计算可见的那一半。{4}',
    'rank {}: seq_all_to_all(x {}, scatter_dim={}, gather_dim={}) returned {}, expected {}':
        'rank {}：seq_all_to_all(x {}, scatter_dim={}, gather_dim={}) 返回了 {}，期望 {}',
    'rank {}: the backward of seq_all_to_all(x {}, scatter_dim={}, gather_dim={}) returned a gradient that does not fit x: {}. Backward is the INVERSE all-to-all (scatter and gather dims swapped).':
        'rank {}：seq_all_to_all(x {}, scatter_dim={}, gather_dim={}) 的反向返回的梯度与 x 不匹配：{}。反向是逆向（INVERSE）的 all-to-all（scatter 和 gather 的维度对调）。',
    'rank {} ({}): expected {} all_to_all of {} elements in {} and nothing else, saw {} (and {} other op(s)). Communication of rank {}:':
        'rank {}（{}）：{4} 中期望 {2} 次 {3} 个元素的 all_to_all，别无其他；实际 {5} 次（另有 {6} 个其他 op）。rank {7} 的通信：',
    '{}: input gradient (the inverse all-to-all)':
        '{}：输入梯度（逆向的 all-to-all）',
    'rank {}: ulysses_attention returned a {}; it returns out only':
        'rank {}：ulysses_attention 返回了一个 {}；它只返回 out',
    "rank {}: ulysses_attention returned {}, expected {} (the rank's sequence shard, all heads)":
        'rank {}：ulysses_attention 返回了 {}，期望 {}（本 rank 的序列 shard，所有 head）',
    'check parameters: seq ({}) must be divisible by world_size ({})':
        '检查参数：seq（{}）必须能被 world_size（{}）整除',
    '{}: q, k, v and out, each [b, s/w, n, d] <-> [b, s, n/w, d]':
        '{}：q、k、v 和 out，各自 [b, s/w, n, d] <-> [b, s, n/w, d]',
    'ulysses_attention with 3 heads on {} ranks':
        'ulysses_attention，3 个 head，{} 个 rank',
    'seq_all_to_all of [2, 4, 3, 2] with scatter_dim=2 (3) on {} ranks':
        '对 [2, 4, 3, 2] 做 seq_all_to_all，scatter_dim=2（3），{} 个 rank',
    'seq_all_to_all with cp_group=0 (a rank, not a ProcessGroup)':
        'seq_all_to_all，cp_group=0（这是一个 rank，不是 ProcessGroup）',
    # checks/expert_parallel/ (but overlap.py)
    'world_size ({}) must be a multiple of ep_size ({})':
        'world_size（{}）必须是 ep_size（{}）的整数倍',
    '{}: expected a tensor of shape {}, got {}':
        '{}：期望一个形状为 {} 的张量，实际是 {}',
    '{} does not require grad: the autograd graph was cut (detach(), .data, torch.no_grad() or a tensor rebuilt from numbers?)':
        '{} 不需要 grad：autograd 计算图被切断了（detach()、.data、torch.no_grad()，还是由数字重新构造的张量？）',
    '{}{} must return a tuple of {}, got {}':
        '{}{} 必须返回由 {} 组成的 tuple，实际是 {}',
    'rank(s) {} returned from the rank program without calling it':
        'rank {} 没有调用它就从 rank 程序返回了',
    'rank {}: {}: {}. Every rank of the group must call the same all-to-alls in the same order, also a rank that sends or receives nothing.':
        'rank {}：{}：{}。组里的每个 rank 都必须按相同的顺序调用相同的 all-to-all，什么也不发送或接收的 rank 也一样。',
    'all-to-all number {} that this rank issued on the group of ranks {}':
        '本 rank 在由 rank {1} 组成的组上发起的第 {0} 次 all-to-all',
    'rank {}: {}: needs {} input and {} output split sizes (one per rank), got input_split_sizes {}, output_split_sizes {} for {} input rows':
        'rank {}：{}：需要 {} 个输入 split 大小和 {} 个输出 split 大小（每个 rank 一个），实际是 input_split_sizes {}、output_split_sizes {}，输入有 {} 行',
    'rank {}: {}: input_split_sizes {} sum to {}, but the input has {} rows':
        'rank {}：{}：input_split_sizes {} 的和是 {}，但输入有 {} 行',
    '. In backward the gradient of the output goes back to where it came from: the same all-to-all with the splits swapped':
        '。反向时输出的梯度要回到它来的地方：同一个 all-to-all，split 对调',
    'rank {}: {}: output_split_sizes {} sum to {}, but the output buffer has {} rows':
        'rank {}：{}：output_split_sizes {} 的和是 {}，但输出 buffer 有 {} 行',
    '{}: rank {} expects {} row(s) from rank {} (its output_split_sizes[{}] = {}), but rank {} sends it {} (its input_split_sizes[{}] = {}). What rank i sends to rank j must be what rank j expects from rank i: exchange the token counts first, then pass output_split_sizes = rows received from each rank, input_split_sizes = rows sent to each rank. Splits: ':
        '{}：rank {} 期望从 rank {2} 收到 {1} 行（它的 output_split_sizes[{3}] = {4}），但 rank {5} 发给它 {6} 行（它的 input_split_sizes[{7}] = {8}）。rank i 发给 rank j 的必须正是 rank j 期望从 rank i 收到的：先交换 token 计数，再传 output_split_sizes = 从每个 rank 收到的行数，input_split_sizes = 发给每个 rank 的行数。各 split：',
    '{}: rank {} sends rows of shape {} {}, rank {} rows of shape {} {}: every rank must exchange rows of one shape and dtype.':
        '{}：rank {} 发送的行形状为 {} {}，rank {} 的行形状为 {} {}：每个 rank 交换的行必须是同一形状、同一 dtype。',
    'k ({}) must be in [1, num_experts = {}]':
        'k（{}）必须在 [1, num_experts = {}] 之内',
    "{}: token {} is routed to experts {}, expected {} (its logits {}: the k largest, ties toward the lower expert index; torch.topk's tie order is undefined, a stable sort is not)":
        '{}：token {} 被路由到 expert {}，期望 {}（它的 logits {}：取最大的 k 个，相等时取 expert 下标较小的；torch.topk 对相等值的顺序是未定义的，稳定排序则不是）',
    '{}: probs (softmax over the selected logits, 0 elsewhere)':
        '{}：probs（在选中的 logits 上做 softmax，其余为 0）',
    '{}: the logits were modified in place':
        '{}：logits 被原地修改了',
    '{}: probs does not require grad: the router weight would get no gradient through the probabilities (detach(), .data, or a tensor rebuilt from indices?)':
        '{}：probs 不需要 grad：router 的权重将无法通过概率得到梯度（detach()、.data，还是由下标重新构造的张量？）',
    '{}: probs does not depend on the logits in the autograd graph':
        '{}：在 autograd 计算图里 probs 不依赖 logits',
    '{}: gradient of the logits through probs':
        '{}：经过 probs 的 logits 梯度',
    'k ({}) must be in [1, num_experts = {}) (one expert gets none)':
        'k（{}）必须在 [1, num_experts = {}) 之内（有一个 expert 一个也拿不到）',
    'load_balancing_loss(logits [{}, {}] {}, a routing map with k={}; counts per expert {})':
        'load_balancing_loss(logits [{}, {}] {}，k={} 的路由表；每个 expert 的计数 {})',
    '{}: gradient of the logits':
        '{}：logits 的梯度',
    'k ({}) must be below num_experts ({}): one expert gets none':
        'k（{}）必须小于 num_experts（{}）：有一个 expert 一个也拿不到',
    '{}: sorted_indices has dtype {}, expected int64':
        '{}：sorted_indices 的 dtype 是 {}，期望 int64',
    '{}: sorted_indices[{}] is token {}, expected token {}. Row {} is row {} of expert {}, whose tokens are {}...: rows are grouped by expert (0, 1, ...), and within an expert the tokens stay in order (sort stably).':
        '{}：sorted_indices[{}] 是 token {}，期望 token {}。第 {} 行是 expert {5} 的第 {4} 行，它的 token 是 {6}...：各行按 expert（0, 1, ...）分组，同一 expert 内 token 保持原有顺序（用稳定排序）。',
    '{}: permuted does not require grad: the autograd graph was cut (detach(), .data, torch.no_grad() or a tensor rebuilt from numbers?)':
        '{}：permuted 不需要 grad：autograd 计算图被切断了（detach()、.data、torch.no_grad()，还是由数字重新构造的张量？）',
    '{}: permuted rows (token sorted_indices[i] in row i)':
        '{}：permute 后的行（第 i 行是 token sorted_indices[i]）',
    "{}: gradient of the tokens (the sum of their rows' gradients)":
        '{}：token 的梯度（它们各行梯度之和）',
    'unpermute({} rows of {} {}, routing_map [{}, {}])':
        'unpermute({} 行 {} {}，routing_map [{}, {}])',
    '{}: the output does not require grad: the autograd graph was cut (detach(), .data, torch.no_grad() or a tensor rebuilt from numbers?)':
        '{}：输出不需要 grad：autograd 计算图被切断了（detach()、.data、torch.no_grad()，还是由数字重新构造的张量？）',
    "{}: output (each token's rows summed":
        '{}：输出（每个 token 的各行求和',
    ', weighted by probs[token, expert])':
        '，按 probs[token, expert] 加权）',
    '{}: gradient of the permuted rows':
        '{}：permute 后各行的梯度',
    '{}: gradient of probs':
        '{}：probs 的梯度',
    '{}: round trip unpermute(permute(x)) with probs = 1 (x times its number of experts)':
        '{}：往返 unpermute(permute(x))，probs = 1（x 乘以它的 expert 个数）',
    'num_experts ({}) must be divisible by {}':
        'num_experts（{}）必须能被 {} 整除',
    '{}: output (the blocks received from ranks 0, 1, ...)':
        '{}：输出（从 rank 0, 1, ... 收到的各块）',
    '{}; a group of size 1 communicates nothing':
        '{}；组大小为 1 时不做任何通信',
    'the backward is the same all-to-all with the splits swapped':
        '反向是 split 对调后的同一个 all-to-all',
    'all_to_all of {} {} with splits in {} out {}':
        '{} {} 的 all_to_all，split 为 in {} out {}',
    'rank {} ({}): expected in {}: {}':
        'rank {}（{}）：{} 中期望：{}',
    '. Communication of rank {}:':
        '。rank {} 的通信：',
    'MoELayer with 5 experts on 2 ranks':
        'MoELayer，5 个 expert，2 个 rank',
    'MoELayer with a router weight of shape [3, 4] (must be [num_experts, hidden_size] = [4, 3])':
        'MoELayer，router 权重形状为 [3, 4]（必须是 [num_experts, hidden_size] = [4, 3]）',
    'AllToAllTokenDispatcher(5 experts) on 2 ranks':
        'AllToAllTokenDispatcher(5 个 expert)，2 个 rank',
    'AllToAllTokenDispatcher(4 experts).dispatch with a routing map of 6 experts':
        'AllToAllTokenDispatcher(4 个 expert).dispatch，路由表却有 6 个 expert',
    'all_to_all(x [5, 2], input_split_sizes=[2, 2]): the splits sum to 4, not 5':
        'all_to_all(x [5, 2], input_split_sizes=[2, 2])：split 的和是 4，不是 5',
    'all_to_all with 3 input split sizes on a group of 2':
        'all_to_all，3 个输入 split 大小，组大小却是 2',
    'topk_router(logits [4, 3], k=4): k larger than the number of experts':
        'topk_router(logits [4, 3], k=4)：k 大于 expert 的个数',
    '{}: {} experts, k={}, world size {}':
        '{}：{} 个 expert，k={}，world size {}',
    ', {} tokens of {} {} per rank, pattern {}':
        '，每个 rank {} 个 {} {} 的 token，模式 {}',
    'token {} of rank {}':
        'rank {1} 的 token {0}',
    'a row that is no token (columns 0, 1 = {}, {})':
        '一行不是任何 token 的数据（第 0、1 列 = {}, {}）',
    'rank {} ({}): expert_input row {} is {}, expected token {} of rank {} (for global expert {}, local expert {}). Rows are grouped by local expert (0, 1, ...), within an expert by source rank, then by token index.':
        'rank {0}（{1}）：expert_input 的第 {2} 行是 {3}，期望 rank {5} 的 token {4}（对应全局 expert {6}，本地 expert {7}）。各行先按本地 expert（0, 1, ...）分组，同一 expert 内按源 rank，再按 token 下标排列。',
    '{}: tokens_per_local_expert (tokens each local expert receives from all ranks)':
        '{}：tokens_per_local_expert（每个本地 expert 从所有 rank 收到的 token 数）',
    '{}: round trip combine(dispatch(x)) with probs = 1 (x times its number of experts)':
        '{}：往返 combine(dispatch(x))，probs = 1（x 乘以它的 expert 个数）',
    '{}: combine output, experts computing 2 z - 1 (sum_e probs[t, e] (2 x_t - 1))':
        '{}：combine 的输出，各 expert 计算 2 z - 1（sum_e probs[t, e] (2 x_t - 1)）',
    '{}: gradient of the tokens':
        '{}：token 的梯度',
    '{}: gradient of probs (0 where a token is not routed)':
        '{}：probs 的梯度（token 没有路由到的地方为 0）',
    'rank {} ({}): expected the integer token counts to be exchanged once in forward, before the tokens (an all-to-all of the {} counts, or an all-gather of {} x {}); saw {} integer collective(s). Without the counts a rank cannot know how many rows to expect from each rank. {}':
        'rank {}（{}）：期望在前向中、token 之前交换一次整数 token 计数（对 {} 个计数做 all-to-all，或对 {} x {} 做 all-gather）；实际有 {} 次整数集合通信。没有计数，rank 就不知道该从每个 rank 收多少行。{}',
    'rank {} ({}): the count exchange should be an all-to-all of the {} counts or an all-gather of {}; saw {}. {}':
        'rank {}（{}）：计数交换应该是对 {} 个计数的 all-to-all，或对 {} 的 all-gather；实际看到 {}。{}',
    'rank {} ({}): unexpected communication in forward: {}. {}':
        'rank {}（{}）：前向中有意外的通信：{}。{}',
    'rank {} ({}): expected these float all-to-alls in forward (the splits are the rows this rank sends to / receives from each rank; one more of the probabilities with the dispatch splits is allowed): {}. {}':
        'rank {}（{}）：前向中期望这些浮点 all-to-all（split 是本 rank 发给 / 收自每个 rank 的行数；允许再多一次用 dispatch 的 split 传概率）：{}。{}',
    'rank {} ({}): the token counts must be exchanged before the tokens: the receivers size their buffers from them. {}':
        'rank {}（{}）：token 计数必须在 token 之前交换：接收方要按它们来确定 buffer 的大小。{}',
    'rank {} ({}): every float all-to-all of forward must be mirrored in backward with its splits swapped (and the count exchange must not: integers carry no gradient). Expected in backward: {}. {}':
        'rank {}（{}）：前向的每次浮点 all-to-all 在反向中都必须有 split 对调的镜像（计数交换则不能有：整数不带梯度）。反向中期望：{}。{}',
    '{}: all-to-all #{} ({}): rank {} sends {} rows to rank {}, which expects {}: the split sizes disagree across ranks.':
        '{}：all-to-all #{0}（{1}）：rank {2} 发给 rank {4} {3} 行，而后者期望 {5} 行：各 rank 的 split 大小不一致。',
    'apply_router_token_dropping(probs [{}, {}] {}, k={}, capacity_factor={}): capacity {} per expert':
        'apply_router_token_dropping(probs [{}, {}] {}, k={}, capacity_factor={})：每个 expert 的容量为 {}',
    '{}: the kept routing map':
        '{}：保留下来的路由表',
    '{}: expert {} keeps tokens {}, expected {}. Its candidates (token, probability): {}: keep the {} highest probabilities, the earlier token among equal ones':
        '{}：expert {} 保留了 token {}，期望 {}。它的候选（token，概率）：{}：保留概率最高的 {} 个，相等时保留靠前的 token',
    " (this expert has an exact tie across its cut: sort with stable=True; torch.topk's order among equal values is undefined).":
        '（这个 expert 在截断处恰好有相等的概率：用 stable=True 排序；torch.topk 对相等值的顺序是未定义的）。',
    '{}: the returned probs do not require grad: the router would get no gradient through them (detach() or a tensor rebuilt from numbers?)':
        '{}：返回的 probs 不需要 grad：router 将无法通过它们得到梯度（detach()，还是由数字重新构造的张量？）',
    '{}: probs (kept ones unchanged, not renormalised; 0 for dropped)':
        '{}：probs（保留的不变，不重新归一化；丢弃的为 0）',
    '{}: gradient of probs (only where kept)':
        '{}：probs 的梯度（只在保留的地方）',
    'check parameters: no case of {} tokens, {} experts, k={} on {} ranks found in 200 draws (seed {}): try another seed':
        '检查参数：{} 个 token、{} 个 expert、k={}、{} 个 rank，抽了 200 次也没找到合适的例子（seed {}）：换一个 seed',
    'rank {}: MoELayer must hold the router as .router (with .weight [E, h]) and its {} local experts as .local_experts, a list of ExpertMLP (each with .linear_fc1 and .linear_fc2)':
        'rank {}：MoELayer 必须把 router 存为 .router（带 .weight [E, h]），把它的 {} 个本地 expert 存为 .local_experts，一个 ExpertMLP 的列表（每个带 .linear_fc1 和 .linear_fc2）',
    'rank {} (rank {} of its EP group {}): MoELayer.local_experts holds {} experts, expected {}: experts [{}, {}) of the {} (use the rank in ep_group, not the global rank)':
        'rank {}（它的 EP 组 {2} 中的 rank {1}）：MoELayer.local_experts 有 {3} 个 expert，期望 {4}：{7} 个 expert 中的 [{5}, {6})（用 ep_group 中的 rank，而不是全局 rank）',
    ', {} tokens per rank, {}, pattern {}':
        '，每个 rank {} 个 token，{}，模式 {}',
    'aux_loss (counts before drops)':
        'aux_loss（按丢弃之前的计数）',
    "router.weight.grad (this rank's tokens, through probs and aux_loss)":
        'router.weight.grad（本 rank 的 token，经过 probs 和 aux_loss）',
    "local_experts[{}].{}.weight.grad (global expert {}: every rank's tokens for it; zeros if none)":
        'local_experts[{}].{}.weight.grad（全局 expert {}：每个 rank 发给它的 token；没有时为零）',
    " The output is right but the router's gradient is not: the gradient through the probabilities is lost or wrong (probs computed from detached logits?).":
        '输出是对的，但 router 的梯度不对：经过概率的梯度丢了或者错了（probs 是用 detach 过的 logits 算的？）。',
    '  On rank {}, wrong: {}; right: {}.{}':
        '  rank {} 上，不对的：{}；对的：{}。{}',
    # checks/expert_parallel/overlap.py
    'num_tokens ({}) must be >= 2: two halves':
        'num_tokens（{}）必须 >= 2：要分成两半',
    ', {} tokens per rank (halves: tokens {} and {}), {}, pattern {}':
        '，每个 rank {} 个 token（两半：token {} 和 {}），{}，模式 {}',
    'half {}: dispatch all_to_all of [{}, {}] with splits in {} out {}, combine [{}, {}] in {} out {}':
        '第 {} 半：dispatch 对 [{}, {}] 做 all_to_all，split 为 in {} out {}，combine [{}, {}] in {} out {}',
    "rank {} ({}): no integer token counts were exchanged in forward: each half's split sizes come from its counts (exchange_token_counts). {}":
        'rank {}（{}）：前向中没有交换整数 token 计数：每一半的 split 大小都来自它的计数（exchange_token_counts）。{}',
    " A half's splits are the rows of ITS tokens that the routing of all T tokens sends to (receives from) each rank: route, and drop with a capacity factor, over all T tokens, then cut the halves.":
        '每一半的 split，是在全部 T 个 token 的路由下，它自己（ITS）的 token 发往（收自）每个 rank 的行数：先在全部 T 个 token 上路由、按 capacity factor 丢弃，然后再切成两半。',
    'rank {} ({}): expected in forward, besides the integer counts, these all-to-alls of token rows (each half on its own: tokens {} and {} of this rank), in any order: {}':
        'rank {}（{}）：前向中除了整数计数，期望还有这些 token 行的 all-to-all（每一半各自进行：本 rank 的 token {} 和 {}），顺序不限：{}',
    'rank {} ({}): the token rows travel in {}, expected {} (the dtype of hidden_states). {}':
        'rank {}（{}）：token 行以 {} 传输，期望 {}（hidden_states 的 dtype）。{}',
    'rank {} ({}): every float all-to-all of forward must be mirrored once in backward with its splits swapped (the integer counts are not: they carry no gradient): expected {}. {}':
        'rank {}（{}）：前向的每次浮点 all-to-all 在反向中都必须有一次 split 对调的镜像（整数计数不用：它们不带梯度）：期望 {}。{}',
    'back to the source':
        '回到源 rank',
    'to the experts':
        '发往 expert',
    'back to the source: the input gradient':
        '回到源 rank：输入梯度',
    'to the experts: the output gradient':
        '发往 expert：输出梯度',
    'rank {} ({}): local expert {} was called on {} row(s) whose first is no token of any rank: the experts must receive the token rows themselves (dispatch moves rows unchanged; the probabilities are applied in combine).':
        'rank {}（{}）：本地 expert {} 在 {} 行上被调用，而第一行不是任何 rank 的 token：expert 必须收到 token 行本身（dispatch 原样搬运各行；概率在 combine 中才乘上）。',
    'a Work not returned by an all-to-all':
        '一个不是 all-to-all 返回的 Work',
    'an all-to-all of the counts or another op':
        '一次对计数的 all-to-all，或者别的 op',
    'token counts exchanged{}: {}':
        '交换了 token 计数{}：{}',
    'half {}: local experts start ({} call(s), until #{})':
        '第 {} 半：本地 expert 开始（{} 次调用，直到 #{}）',
    'half {}: local experts end':
        '第 {} 半：本地 expert 结束',
    'The {} of rank {}, in order:':
        'rank {1} 的 {0}，按顺序：',
    'rank {} ({}): {}: no all-to-all of {} (each half sends its own rows: its own splits). {}':
        'rank {}（{}）：{}：没有 {} 的 all-to-all（每一半发送它自己的行：用它自己的 split）。{}',
    "rank {} ({}): {}: no computation of the local experts on half {}'s rows was seen (call each local expert as a module on the rows, e.g. run_local_experts; in backward the experts' backward runs when the gradient of their output arrives). {}":
        'rank {}（{}）：{}：没有看到本地 expert 在第 {} 半的行上做计算（把每个本地 expert 当作模块作用在这些行上，例如 run_local_experts；反向时，expert 输出的梯度一到，expert 的反向就会运行）。{}',
    'rank {} ({}): {}: {} is a functional collective (torch.distributed._functional_collectives): the ledger cannot see when its AsyncCollectiveTensor is waited. Post it with dist.all_to_all_single(..., async_op=True) and call .wait() on the work it returns. {}':
        'rank {}（{}）：{}：{} 是 functional collective（torch.distributed._functional_collectives）：账本看不到它的 AsyncCollectiveTensor 何时被等待。用 dist.all_to_all_single(..., async_op=True) 发起它，再对返回的 work 调用 .wait()。{}',
    'rank {} ({}): {}: {} was never waited for: call .wait() on its work before using what it received. {}':
        'rank {}（{}）：{}：{} 从没被等待：使用它收到的数据之前，对它的 work 调用 .wait()。{}',
    "rank {} ({}): {}: {} all-to-all (#{}) was synchronous: it returned only once the rows had arrived, so half {}'s experts could not run meanwhile. Post it with dist.all_to_all_single(..., async_op=True) and wait on its work after half {}'s experts. {}":
        'rank {}（{}）：{}：{} 的 all-to-all（#{}）是同步的：它要等各行到达才返回，于是第 {} 半的 expert 无法同时运行。用 dist.all_to_all_single(..., async_op=True) 发起它，在第 {} 半的 expert 之后再等待它的 work。{}',
    'posted after they started':
        '在它们开始之后才发起',
    'by {}, before they ended':
        '在它们结束之前就由 {} 完成了',
    'run their backward':
        '做反向',
    "rank {} ({}): {}: {} all-to-all must be in flight while half {}'s experts {} (#{} to #{}): posted before #{} and waited after #{}; it was posted at #{} and completed at #{} ({}).{} ":
        'rank {}（{}）：{}：{} 的 all-to-all 必须在第 {} 半的 expert {}（#{} 到 #{}）时处于进行中：在 #{} 之前发起，在 #{} 之后等待；它在 #{} 发起，在 #{} 完成（{}）。{}',
    "rank {} ({}): {}: half {}'s {} all-to-all (#{}) must be waited before half {}'s experts {} on what it brings (from #{}); it was completed at #{} by {}. {}":
        'rank {}（{}）：{}：第 {} 半的 {} all-to-all（#{}）必须在第 {} 半的 expert {}（从 #{} 起）用到它带来的数据之前被等待；它是在 #{} 由 {} 完成的。{}',
    "The check's transport holds every asynchronous all-to-all: until its work is waited (or completed another way: is_completed(), get_future(), synchronize(), result(), a barrier), its output buffer holds NaN, the check's poison, whatever the machine's speed.":
        '检查的传输层会扣住每个异步 all-to-all：在它的 work 被等待（或以别的方式完成：is_completed()、get_future()、synchronize()、result()、barrier）之前，它的输出 buffer 里都是 NaN，即检查的毒值（poison），不论机器快慢。',
    "NaN on rank(s) {} is the check's poison: rows of an all-to-all were read before its work was waited. {} test_moe_overlap says where (print_overlap_timeline shows the order).":
        'rank {} 上的 NaN 是检查的毒值（poison）：某个 all-to-all 的行在它的 work 被等待之前就被读取了。{}test_moe_overlap 会指出是哪里（print_overlap_timeline 显示顺序）。',
    'a barrier of its group (dist.barrier)':
        '它所在组的一次 barrier（dist.barrier）',
    ' At #{} these were still in flight: {}.':
        '在 #{} 时仍在进行中的有：{}。',
    "rank {} ({}): forward: local expert {} computed (#{}) on rows that had not arrived: its input held NaN. {} A half's experts (and anything computed from its received buffer) must run after that half's dispatch all-to-all is waited. {}":
        'rank {}（{}）：forward：本地 expert {} 在尚未到达的行上做了计算（#{}）：它的输入是 NaN。{}每一半的 expert（以及任何用这一半收到的 buffer 算出的数据）都必须在这一半的 dispatch all-to-all 被等待之后运行。{}',
    "rank {} ({}): backward: local expert {}'s backward ran (#{}) on an output gradient that had not arrived: it held NaN. {} A half's experts' backward must run after that half's combine-backward all-to-all (its output gradient, travelling to the experts) is waited. {}":
        'rank {}（{}）：backward：本地 expert {} 的反向在尚未到达的输出梯度上运行了（#{}）：这个梯度是 NaN。{}每一半 expert 的反向都必须在这一半的 combine-backward all-to-all（它传给 expert 的输出梯度）被等待之后运行。{}',
    "the layer's output (what combine brought home)":
        '层的输出（combine 带回来的数据）',
    "the input gradient (what dispatch's backward brought home)":
        '输入梯度（dispatch 的反向带回来的数据）',
    "rank {} ({}): {}: {} held NaN: rows of an all-to-all were read before its work was waited. {} Wait for each half's {} all-to-all before using what it received. {}":
        'rank {}（{}）：{}：{}是 NaN：某个 all-to-all 的行在它的 work 被等待之前就被读取了。{}使用每一半的 {} all-to-all 收到的数据之前，先等待它。{}',
    "Post both halves' {} all-to-alls first, then wait for half {}'s only; post half {}'s {} as soon as its experts are done, and wait for it after half {}'s experts.":
        '先发起两半的 {} all-to-all，然后只等待第 {} 半的；第 {} 半的 expert 一做完就发起它的 {}，在第 {} 半的 expert 之后再等待它。',
    "In backward the same schedule runs in mirror: post both halves' {} all-to-alls, wait for one, run that half's experts' backward (torch.autograd.backward on its outputs), post its {} at once, then the other half.":
        '反向按镜像运行同样的调度：发起两半的 {} all-to-all，等待其中一个，运行那一半 expert 的反向（对它的输出调用 torch.autograd.backward），立即发起它的 {}，然后处理另一半。',
    'rank ({}) must be in [0, {})':
        'rank（{}）必须在 [0, {}) 之内',
    "half {}'s {}":
        '第 {} 半的 {}',
    # checks/composition/
    '{}: a torch.distributed collective was called on a DTensor ({}). Under TP and FSDP parameters and gradients are DTensors: communicate their local shards, `dist.all_reduce(grad.to_local(), ...)`.':
        '{}：对一个 DTensor 调用了 torch.distributed 的集合通信（{}）。在 TP 和 FSDP 下，参数和梯度都是 DTensor：应当传输它们的本地 shard，`dist.all_reduce(grad.to_local(), ...)`。',
    '{}: layout[{}] must be a list of rank lists, got {}':
        '{}：layout[{}] 必须是由 rank 列表组成的列表，实际是 {}',
    '{}: layout[{}] holds a group with non-int ranks: {}':
        '{}：layout[{}] 中有一个组的 rank 不是 int：{}',
    '{} returned {}, expected a dict {{name: [[ranks], ...]}}':
        '{} 返回了 {}，期望一个 dict {{name: [[ranks], ...]}}',
    '{}: no key(s) {}; returned keys: {}':
        '{}：没有键 {}；返回的键：{}',
    'the same groups, in another order: list the groups, and the ranks inside each group, with the innermost dimension varying fastest':
        '组是一样的，但顺序不同：列出各组以及每组内的 rank 时，让最内层的维度变化最快',
    '{} group(s) of size(s) {}; expected {} of size {}':
        '{} 个组，大小为 {}；期望 {} 个大小为 {} 的组',
    'different ranks in the groups':
        '组里的 rank 不同',
    '  first difference at group {}: expected {}, got {}':
        '  第一处不同在组 {}：期望 {}，实际 {}',
    '{}: expected a ValueError naming {} (these sizes and order cannot be laid out as Megatron does), got a {}':
        '{}：期望一个指出 {} 的 ValueError（这些大小和 order 无法像 Megatron 那样排布），实际是 {}',
    '{} raised {}: {}; expected a ValueError naming the sizes':
        '{} 抛出了 {}：{}；期望一个指出相关大小的 ValueError',
    '{} raised ValueError({}), which does not name {}: say which sizes do not fit':
        '{} 抛出了 ValueError({})，但没有指出 {}：请说明哪些大小对不上',
    'rank {}: build_process_groups returned {}, expected a dict':
        'rank {}：build_process_groups 返回了 {}，期望一个 dict',
    'rank {}: build_process_groups()[{}] is a {}, expected a torch.distributed.ProcessGroup':
        'rank {}：build_process_groups()[{}] 是 {}，期望 torch.distributed.ProcessGroup',
    'rank {}: layout[{}] has no group containing rank {}, yet build_process_groups returned one with ranks {}':
        'rank {}：layout[{}] 中没有包含 rank {} 的组，build_process_groups 却返回了一个由 rank {} 组成的组',
    'rank {}: build_process_groups()[{}] is missing; expected the group {}':
        'rank {}：缺少 build_process_groups()[{}]；期望组 {}',
    "rank {}: build_process_groups()[{}] has ranks {}, expected {} (this rank's group of layout[{}])":
        'rank {}：build_process_groups()[{}] 的 rank 是 {}，期望 {}（本 rank 在 layout[{}] 中的组）',
    'rank {}: an all-reduce over build_process_groups()[{}] summed to {}, expected {} (the sum of its ranks {})':
        'rank {}：在 build_process_groups()[{}] 上 all-reduce 的和是 {}，期望 {}（它的 rank {} 之和）',
    'rank {}: {} returned a {}, expected a DeviceMesh':
        'rank {}：{} 返回了 {}，期望一个 DeviceMesh',
    "rank {}: {} has dimensions {} (shape {}); expected {}: the order's tokens reversed, because a DeviceMesh's last dimension is the innermost (adjacent ranks)":
        'rank {}：{} 的维度是 {}（形状 {}）；期望 {}：order 中维度名的倒序，因为 DeviceMesh 的最后一个维度是最内层（相邻的 rank）',
    "rank {}: {}[{}] spans ranks {}, expected {} (rank_layout's {} group of rank {}, order {})":
        'rank {}：{}[{}] 覆盖的 rank 是 {}，期望 {}（rank_layout 中 rank {6} 的 {5} 组，order {7}）',
    "rank {}: local_batch returned {} {}; expected a dict with keys 'tokens', 'labels', 'positions'":
        "rank {}：local_batch 返回了 {} {}；期望一个键为 'tokens'、'labels'、'positions' 的 dict",
    'rank {} (mesh coordinates {})':
        'rank {}（mesh 坐标 {}）',
    '{}: positions {}, expected {} (CP rank {} of {} keeps sequence chunks {} and {} of {})':
        '{}：positions 是 {}，期望 {}（{3} 个 CP rank 中的第 {2} 个保留 {6} 块序列中的第 {4} 块和第 {5} 块）',
    '{}: {} has shape {}, expected {} ([B/dp, S/cp] = [{}/{}, {}/{}])':
        '{}：{} 的形状是 {}，期望 {}（[B/dp, S/cp] = [{}/{}, {}/{}]）',
    'its first row is global row {}, expected row {} (DP rank {} of {}: rows {}..{}; use the DP coordinate, not the global rank)':
        '它的第一行是全局的第 {} 行，期望第 {} 行（{3} 个 DP rank 中的第 {2} 个：第 {4}..{5} 行；用 DP 坐标，而不是全局 rank）',
    "the values are not the global batch's at these rows and positions":
        '这些值不是全局 batch 在这些行和位置上的值',
    'rank {} ({}): after apply_tensor_parallel, model.output.weight is not model.tok_embeddings.weight: parallelize_module replaced both by new DTensor Parameters and so untied them; tie them again (model.output.weight = model.tok_embeddings.weight)':
        'rank {}（{}）：apply_tensor_parallel 之后 model.output.weight 不是 model.tok_embeddings.weight：parallelize_module 把两者都换成了新的 DTensor Parameter，于是解开了 tie；请重新 tie 起来（model.output.weight = model.tok_embeddings.weight）',
    'rank {} ({}): {} is a plain tensor, expected a DTensor with placement {} on the TP mesh (is its module in the plan? norms need SequenceParallel())':
        'rank {}（{}）：{} 是普通张量，期望 TP mesh 上 placement 为 {} 的 DTensor（它的模块在方案里吗？norm 需要 SequenceParallel()）',
    'rank {} ({}): {} has placement {}, expected ({},): column-parallel (q, k, v, w1, w3; the vocabulary-sharded embedding and head) is Shard(0) of the [out, in] weight, row-parallel (wo, w2) Shard(1)':
        'rank {}（{}）：{} 的 placement 是 {}，期望 ({},)：按列并行（q、k、v、w1、w3；按词表切分的 embedding 和 head）是 [out, in] 权重的 Shard(0)，按行并行（wo、w2）是 Shard(1)',
    'rank {} ({}): the model returned a {}; expected the logits as a DTensor sharded over the vocabulary (ColwiseParallel(..., output_layouts=Shard(-1), use_local_output=False)) for loss_parallel()':
        'rank {}（{}）：模型返回了 {}；期望 logits 是按词表切分的 DTensor（ColwiseParallel(..., output_layouts=Shard(-1), use_local_output=False)），交给 loss_parallel()',
    "rank {} ({}): forward all-reduced an activation {} time(s) ({}): with sequence parallelism the only forward all-reduces are the loss's, per token; a row-parallel output is reduce-scattered along the sequence (RowwiseParallel(output_layouts=Shard(1))), a column-parallel one stays sharded. Communication of rank {}:":
        'rank {}（{}）：前向对激活做了 {} 次 all-reduce（{}）：开启序列并行时，前向唯一的 all-reduce 是 loss 的，逐 token；按行并行的输出沿序列做 reduce-scatter（RowwiseParallel(output_layouts=Shard(1))），按列并行的输出保持切分。rank {} 的通信：',
    'rank {} ({}): local_batch gave rank {} other tokens than rank {}, although both are one TP group: TP ranks must compute on the same data (slice by the DP coordinate, not the global rank; exercise 3)':
        'rank {}（{}）：local_batch 给 rank {} 的 token 与 rank {} 的不同，而它们在同一个 TP 组里：TP 的各 rank 必须在相同的数据上计算（按 DP 坐标切片，而不是全局 rank；练习 3）',
    'DP {} x TP {} (SP), {} AdamW steps, global batch [{}, {}]':
        'DP {} x TP {}（SP），{} 步 AdamW，global batch [{}, {}]',
    'rank {} ({}): after apply_tensor_parallel the head is not tied to the embedding any more (parallelize_module replaced both parameters): tie them again before FSDP':
        'rank {}（{}）：apply_tensor_parallel 之后 head 不再与 embedding tie（parallelize_module 替换了这两个参数）：在 FSDP 之前重新把它们 tie 起来',
    "rank {} ({}): parameter {} lives on mesh dimensions {}, expected both ('dp', 'tp'): TP first (apply_tensor_parallel), then FSDP over the DP dimension (apply_fsdp)":
        "rank {}（{}）：参数 {} 位于 mesh 维度 {} 上，期望同时在 ('dp', 'tp') 上：先 TP（apply_tensor_parallel），再在 DP 维度上做 FSDP（apply_fsdp）",
    'rank {} ({}): forward issued {} all-gather(s) of parameters on the DP group, expected {}: one per FSDP unit, i.e. fully_shard on each of the {} blocks, then on the root (embedding, final norm, head). DP-group communication of rank {}:':
        'rank {}（{}）：前向在 DP 组上对参数发起了 {} 次 all-gather，期望 {} 次：每个 FSDP 单元一次，也就是对 {} 个 block 各调用一次 fully_shard，再对根模块（embedding、最后的 norm、head）调用。rank {} 在 DP 组上的通信：',
    '{}: loss of step {} (mean over DP)':
        '{}：第 {} 步的 loss（在 DP 上取平均）',
    '{}: {} after {} steps (gathered)':
        '{}：{1} 步之后的 {0}（gather 后）',
    'check parameters: batch ({}) must be divisible by dp * microbatches ({} * {})':
        '检查参数：batch（{}）必须能被 dp * microbatches（{} * {}）整除',
    'DP {} x TP {}, {} micro-batches, global batch [{}, {}], vocab {}':
        'DP {} x TP {}，{} 个 micro-batch，global batch [{}, {}]，词表 {}',
    'rank {} ({}): pipeline_loss_fn on micro-batch {} returned {}, expected {}, the mean cross-entropy of its {} tokens (ratio {}). The schedule already divides the gradients by the number of micro-batches and FSDP averages over DP: the loss of one micro-batch is averaged over its own tokens only.':
        'rank {}（{}）：pipeline_loss_fn 在 micro-batch {} 上返回了 {}，期望 {}，即它 {} 个 token 的平均交叉熵（比值 {}）。调度已经把梯度除以 micro-batch 的个数，FSDP 也会在 DP 上取平均：一个 micro-batch 的 loss 只对它自己的 token 取平均。',
    "{}: gradient of this rank's logits shard, summed over its micro-batches (before the schedule's 1/{} and FSDP's 1/{})":
        '{}：本 rank logits shard 的梯度，对它的各 micro-batch 求和（在调度的 1/{} 和 FSDP 的 1/{} 之前）',
    'rank {} ({}): reduce_loss_for_logging returned {}, expected a float':
        'rank {}（{}）：reduce_loss_for_logging 返回了 {}，期望一个 float',
    'rank {} ({}): reduce_loss_for_logging returned {}, expected {}, the mean loss of the global batch (ratio expected/got {}: averaged more than once, or summed?). Mean over the micro-batches, then the mean over the DP group, each once.':
        'rank {}（{}）：reduce_loss_for_logging 返回了 {}，期望 {}，即全局 batch 的平均 loss（期望值/实际值之比 {}：平均了不止一次，还是求了和？）。先在各 micro-batch 上取平均，再在 DP 组上取平均，各一次。',
    '{}; stage {} holds no embedding':
        '{}；stage {} 不持有 embedding',
    "{}: stage {}'s gradient of the tied weight (expected the sum of the embedding's and the head's)":
        '{}：stage {} 上 tied 权重的梯度（期望是 embedding 的与 head 的之和）',
    '{}; one stage: the weight is tied in one module':
        '{}；只有一个 stage：权重在同一个模块里 tie',
    'rank {} ({}): expected exactly one all-reduce over the embedding group (2 ranks: the first and last stage), saw:':
        'rank {}（{}）：期望在 embedding 组（2 个 rank：第一个和最后一个 stage）上恰好一次 all-reduce，实际看到：',
    "rank {} ({}): returned norm {}, expected {}, the norm of the whole model's gradient. Count every distinct element once: each shard once, a piece replicated over a mesh dimension (the {} norm-scale elements, Replicate() over TP) once and not once per replica, every pipeline stage (sum the squares over pp_group), and the tied head's copy (.shared) not at all.":
        'rank {}（{}）：返回的范数是 {}，期望 {}，即整个模型梯度的范数。每个不同的元素只算一次：每个 shard 一次，在某个 mesh 维度上复制的片段（{} 个 norm 缩放系数元素，在 TP 上 Replicate()）只算一次，而不是每个副本各一次，每个流水线 stage 都要算（在 pp_group 上对平方求和），tied head 的副本（.shared）完全不算。',
    '{}: clipped gradient of {} (stage {})':
        '{}：{} 裁剪后的梯度（stage {}）',
    'check_pipeline_training: functions is missing {}':
        'check_pipeline_training：functions 缺少 {}',
    'PP {} x DP {} x TP {}, {} micro-batches, {} steps, clipped at {}':
        'PP {} x DP {} x TP {}，{} 个 micro-batch，{} 步，按 {} 裁剪',
    'rank {} ({}): pipeline_train_step returned {} on stage {}; only the last stage has the loss (return None elsewhere)':
        'rank {0}（{1}）：pipeline_train_step 在 stage {3} 上返回了 {2}；只有最后一个 stage 才有 loss（其他地方返回 None）',
    'rank {} ({}): pipeline_train_step returned {} on the last stage; expected the loss of the global batch as a float':
        'rank {}（{}）：pipeline_train_step 在最后一个 stage 上返回了 {}；期望以 float 返回全局 batch 的 loss',
    '{}: logged loss of step {}':
        '{}：第 {} 步记录的 loss',
    'rank {} ({}): stage {} has no parameters':
        'rank {}（{}）：stage {} 没有参数',
    'rank {} ({}): stage {} has a parameter {} the model does not have':
        'rank {}（{}）：stage {} 有一个模型里没有的参数 {}',
    "the tied head's copy on the last stage: its gradient must be summed with the embedding's (allreduce_tied_embedding_grads) before clipping":
        '最后一个 stage 上 tied head 的副本：裁剪之前，它的梯度必须与 embedding 的梯度相加（allreduce_tied_embedding_grads）',
    '{}: {} after {} steps (stage {})':
        '{}：{1} 步之后的 {0}（stage {2}）',
    'plot_rank_layout: gpus_per_node must be a positive int, got {}':
        'plot_rank_layout：gpus_per_node 必须是正整数，实际是 {}',
    'plot_rank_layout: layout has none of the dimensions {}: its keys are {}':
        'plot_rank_layout：layout 中没有维度 {} 中的任何一个：它的键是 {}',
    '{}, {}{}, micro-batch {}, seq {}, global batch {}':
        '{}，{}{}，micro-batch {}，seq {}，global batch {}',
    '{}: returned {}, expected a dict with keys {}':
        '{}：返回了 {}，期望一个键为 {} 的 dict',
    '{}: no key(s) {}; returned keys {}':
        '{}：没有键 {}；返回的键是 {}',
    '{}: [{}] is a {}, expected a number':
        '{}：[{}] 是 {}，期望一个数',
    '{}: the worst stage is {}, got {}':
        '{}：最差的 stage 是 {}，实际是 {}',
    '{}: expected between {} and {} GB on the worst GPU, got {}{} ({})':
        '{}：最差的 GPU 上期望在 {} 到 {} GB 之间，实际是 {}{}（{}）',
    '{}: returned {}, expected an autograder.lessons.planner.Plan':
        '{}：返回了 {}，期望一个 autograder.lessons.planner.Plan',
    '{}: {} GB on the worst GPU, expected between {} and {} GB (breakdown: ':
        '{}：最差的 GPU 上 {} GB，期望在 {} 到 {} GB 之间（明细：',
    '{}: feasible, yet with reasons {}':
        '{}：标记为可行，却带有原因 {}',
    '{}: expected a reason mentioning {}, got {}':
        '{}：期望一条提到 {} 的原因，实际是 {}',
    "{}: time['total'] is {}, expected a positive number of seconds":
        "{}：time['total'] 是 {}，期望一个正的秒数",
    "{}: mfu {}, expected {}: the model's FLOPs of the step, {} (global batch x seq x flops_per_token, no recomputation), over total seconds x GPUs x peak FLOP/s = {} x {} x {}":
        '{}：mfu {}，期望 {}：这一步的模型 FLOPs，{}（global batch x seq x flops_per_token，不含重算），除以总秒数 x GPU 数 x 峰值 FLOP/s = {} x {} x {}',
    '{}: expected a list of Plan, got {}':
        '{}：期望一个 Plan 列表，实际是 {}',
    "{}: expected the {} fastest feasible layouts, fastest first, as the course's reference planner ranks them: {}; got {}. A search that is right ranks wrong when memory_per_gpu, step_time or plan are off: check those first.":
        '{}：期望课程参考 planner 排出的 {} 个最快的可行布局，最快的在前：{}；实际是 {}。memory_per_gpu、step_time 或 plan 有偏差时，搜索本身即使正确，排序也会错：先检查它们。',
    '{}: returned an infeasible plan: {} ({})':
        '{}：返回了一个不可行的方案：{}（{}）',
    '{}: returned layouts with micro-batch {}, expected {} for every candidate: build each Layout with the micro_batch you were given (it changes the micro-batch count, the memory in flight, the bubble and every volume)':
        '{}：返回的布局的 micro-batch 是 {}，期望每个候选都是 {}：用给你的 micro_batch 构造每个 Layout（它会改变 micro-batch 的个数、进行中的 micro-batch 占用的显存、bubble 和每一项通信量）',
}

ZH = {**RUNTIME, **CHECKS}
