/* SPDX-License-Identifier: MIT */
/*
 * tiers/tcuda — the few CUDA runtime calls the tiers make, behind plain C
 * functions returning -errno, so backends carry no #if.  Without CUDA every
 * function reports the device unusable (-MKV_ENODEV).  Nothing here runs at
 * load time (Criterion forks: never touch CUDA in a constructor).
 */
#ifndef MKV_TIERS_TCUDA_H
#define MKV_TIERS_TCUDA_H

#include <stddef.h>

/* 1 if built with CUDA and device @dev exists and can be selected. */
int tcuda_usable(int dev);
int tcuda_malloc(int dev, size_t len, void **p);
void tcuda_free(int dev, void *p);
/* Synchronous copies (device <-> host); -EIO on a CUDA error. */
int tcuda_h2d(int dev, void *dst, const void *src, size_t len);
int tcuda_d2h(int dev, void *dst, const void *src, size_t len);
int tcuda_d2d(int dev, void *dst, const void *src, size_t len);
/* A non-blocking stream on @dev (as void *, so callers need no CUDA
 * header), an asynchronous host-to-device copy on it (pinned @src: the
 * call returns before the copy is done), and a wait for the stream.
 * -MKV_ENODEV, -ENOMEM (stream), -EIO (a CUDA error). */
int tcuda_stream_create(int dev, void **stream);
void tcuda_stream_destroy(int dev, void *stream);
int tcuda_h2d_async(int dev, void *dst, const void *src, size_t len,
		    void *stream);
int tcuda_stream_sync(int dev, void *stream);
/* Page-lock [p, p+len) for DMA, mapped into the device address space
 * (cudaHostRegister, portable | mapped). */
int tcuda_host_register(void *p, size_t len);
/* 1 if kernels on @dev can dereference registered host pointers as they
 * are (unified addressing, canUseHostPointerForRegisteredMem). */
int tcuda_host_ptr_usable(int dev);
/* 1 if @p lies in page-locked host memory mapped for the device. */
int tcuda_is_mapped_host(const void *p);
/* 1 if a kernel on @dev can read @p as it is: device memory of @dev, or
 * mapped page-locked host memory at its own address. */
int tcuda_device_readable(int dev, const void *p);
void tcuda_host_unregister(void *p);
/* NUMA node of device @dev from its PCI address (sysfs), or -1. */
int tcuda_numa_node(int dev);

#endif
