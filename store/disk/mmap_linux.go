package disk

import "syscall"

// mmapFlags asks the kernel to map the whole file up front: Open reads
// every page anyway, and one populate pass spares a page fault per 4 KiB.
const mmapFlags = syscall.MAP_POPULATE
