/* stoke — umbrella header: keeps an accelerator fed.  Include this, link -lstoke. */
#ifndef STOKE_H
#define STOKE_H

#include "stoke/status.h"
#include "stoke/log.h"
#include "stoke/version.h"
#include "stoke/backend.h"
#include "stoke/accelerator.h"
#include "stoke/device.h"
#include "stoke/ipc.h"
#include "stoke/arena.h"
#include "stoke/pinned.h"
#include "stoke/dataset.h"
#include "stoke/sources.h"
#include "stoke/sampler.h"
#include "stoke/loader.h"

#endif
