/* SPDX-License-Identifier: MIT */
#include "tiers/tcuda.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>

#include "mkv_config.h"
#include <mosaickv/common.h>

#if MKV_HAVE_CUDA
#include <cuda_runtime.h>

int tcuda_usable(int dev)
{
	int n = 0;

	if (dev < 0 || cudaGetDeviceCount(&n) != cudaSuccess || dev >= n)
		return 0;
	return cudaSetDevice(dev) == cudaSuccess;
}

int tcuda_malloc(int dev, size_t len, void **p)
{
	if (cudaSetDevice(dev) != cudaSuccess)
		return -MKV_ENODEV;
	if (cudaMalloc(p, len) != cudaSuccess) {
		(void)cudaGetLastError(); /* clear the sticky-free error */
		return -ENOMEM;
	}
	return 0;
}

void tcuda_free(int dev, void *p)
{
	if (p && cudaSetDevice(dev) == cudaSuccess)
		cudaFree(p);
}

static int copy(int dev, void *dst, const void *src, size_t len,
		enum cudaMemcpyKind k)
{
	if (cudaSetDevice(dev) != cudaSuccess)
		return -MKV_ENODEV;
	if (cudaMemcpy(dst, src, len, k) != cudaSuccess) {
		(void)cudaGetLastError();
		return -EIO;
	}
	return 0;
}

int tcuda_h2d(int dev, void *dst, const void *src, size_t len)
{
	return copy(dev, dst, src, len, cudaMemcpyHostToDevice);
}

int tcuda_d2h(int dev, void *dst, const void *src, size_t len)
{
	return copy(dev, dst, src, len, cudaMemcpyDeviceToHost);
}

int tcuda_d2d(int dev, void *dst, const void *src, size_t len)
{
	return copy(dev, dst, src, len, cudaMemcpyDeviceToDevice);
}

int tcuda_stream_create(int dev, void **stream)
{
	cudaStream_t st;

	if (cudaSetDevice(dev) != cudaSuccess)
		return -MKV_ENODEV;
	if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess) {
		(void)cudaGetLastError();
		return -ENOMEM;
	}
	*stream = st;
	return 0;
}

void tcuda_stream_destroy(int dev, void *stream)
{
	if (stream && cudaSetDevice(dev) == cudaSuccess)
		cudaStreamDestroy((cudaStream_t)stream);
}

int tcuda_h2d_async(int dev, void *dst, const void *src, size_t len,
		    void *stream)
{
	/* Called from the fetch's pool threads: the device is per thread. */
	if (cudaSetDevice(dev) != cudaSuccess)
		return -MKV_ENODEV;
	if (cudaMemcpyAsync(dst, src, len, cudaMemcpyHostToDevice,
			    (cudaStream_t)stream) != cudaSuccess) {
		(void)cudaGetLastError();
		return -EIO;
	}
	return 0;
}

int tcuda_stream_sync(int dev, void *stream)
{
	if (cudaSetDevice(dev) != cudaSuccess)
		return -MKV_ENODEV;
	if (cudaStreamSynchronize((cudaStream_t)stream) != cudaSuccess) {
		(void)cudaGetLastError();
		return -EIO;
	}
	return 0;
}

int tcuda_host_register(void *p, size_t len)
{
	if (cudaHostRegister(p, len, cudaHostRegisterPortable |
				    cudaHostRegisterMapped) != cudaSuccess) {
		(void)cudaGetLastError();
		return -ENOMEM;
	}
	return 0;
}

void tcuda_host_unregister(void *p)
{
	if (cudaHostUnregister(p) != cudaSuccess)
		(void)cudaGetLastError();
}

int tcuda_host_ptr_usable(int dev)
{
	int v = 0;

	if (cudaDeviceGetAttribute(&v, cudaDevAttrCanUseHostPointerForRegisteredMem,
				   dev) != cudaSuccess) {
		(void)cudaGetLastError();
		return 0;
	}
	return v != 0;
}

int tcuda_is_mapped_host(const void *p)
{
	struct cudaPointerAttributes a;

	if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
		(void)cudaGetLastError();
		return 0;
	}
	return a.type == cudaMemoryTypeHost && a.devicePointer == p;
}

int tcuda_device_readable(int dev, const void *p)
{
	struct cudaPointerAttributes a;

	if (!p || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
		(void)cudaGetLastError();
		return 0;
	}
	if (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged)
		return a.device == dev;
	return a.type == cudaMemoryTypeHost && a.devicePointer == p;
}

int tcuda_numa_node(int dev)
{
	char bus[32], path[96];
	FILE *f;
	int node = -1;

	if (cudaDeviceGetPCIBusId(bus, sizeof bus, dev) != cudaSuccess) {
		(void)cudaGetLastError();
		return -1;
	}
	for (char *c = bus; *c; c++)
		*c = (char)tolower((unsigned char)*c);
	snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/numa_node", bus);
	f = fopen(path, "r");
	if (!f)
		return -1;
	if (fscanf(f, "%d", &node) != 1)
		node = -1;
	fclose(f);
	return node;
}

#else /* !MKV_HAVE_CUDA */

int tcuda_usable(int dev) { (void)dev; return 0; }
int tcuda_malloc(int dev, size_t len, void **p)
{ (void)dev; (void)len; (void)p; return -MKV_ENODEV; }
void tcuda_free(int dev, void *p) { (void)dev; (void)p; }
int tcuda_h2d(int dev, void *dst, const void *src, size_t len)
{ (void)dev; (void)dst; (void)src; (void)len; return -MKV_ENODEV; }
int tcuda_d2h(int dev, void *dst, const void *src, size_t len)
{ (void)dev; (void)dst; (void)src; (void)len; return -MKV_ENODEV; }
int tcuda_d2d(int dev, void *dst, const void *src, size_t len)
{ (void)dev; (void)dst; (void)src; (void)len; return -MKV_ENODEV; }
int tcuda_stream_create(int dev, void **stream)
{ (void)dev; (void)stream; return -MKV_ENODEV; }
void tcuda_stream_destroy(int dev, void *stream) { (void)dev; (void)stream; }
int tcuda_h2d_async(int dev, void *dst, const void *src, size_t len,
		    void *stream)
{ (void)dev; (void)dst; (void)src; (void)len; (void)stream; return -MKV_ENODEV; }
int tcuda_stream_sync(int dev, void *stream)
{ (void)dev; (void)stream; return -MKV_ENODEV; }
int tcuda_host_register(void *p, size_t len)
{ (void)p; (void)len; return -MKV_ENODEV; }
void tcuda_host_unregister(void *p) { (void)p; }
int tcuda_host_ptr_usable(int dev) { (void)dev; return 0; }
int tcuda_is_mapped_host(const void *p) { (void)p; return 0; }
int tcuda_device_readable(int dev, const void *p)
{ (void)dev; (void)p; return 0; }
int tcuda_numa_node(int dev) { (void)dev; return -1; }

#endif
