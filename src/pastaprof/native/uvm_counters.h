/* The unified-memory counters pastaprof records, the same for a Python session (cupti_drain.c)
 * and a native program (inject_cupti.c), so both fill the `uvm` kind alike. */
#ifndef PASTAPROF_UVM_COUNTERS_H
#define PASTAPROF_UVM_COUNTERS_H
#include <cupti.h>

static const CUpti_ActivityUnifiedMemoryCounterKind pp_uvm_counter_kinds[] = {
    CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_HTOD,
    CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_DTOH,
    CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_DTOD,
    CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_CPU_PAGE_FAULT_COUNT,
    CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_GPU_PAGE_FAULT,
    CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_THRASHING,
    CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_THROTTLING,
    CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_REMOTE_MAP};
enum { PP_UVM_COUNTER_KINDS = sizeof pp_uvm_counter_kinds / sizeof pp_uvm_counter_kinds[0] };

#endif
